#!/usr/bin/env bash
# One call on the GPU machine: install hfnn, run every test, benchmark, run the examples; results
# and logs under $OUT. Stages to run are the arguments (default: all):
#   tests     C++ variant tests (gtest) and the Python tests, GPU ones included
#   tests-quick  gtest and the LayerNorm and dispatch Python tests only (about 3 minutes less than
#             tests; 11 minutes on an H100 on 2026-11-28, over one device call, before test_dispatch.py's
#             tests shared their tables: use the two below)
#   pytest-quick  the LayerNorm and dispatch Python tests alone (144 tests; on an H200 on 2026-11-29
#             test_layer_norm.py 35 s and test_dispatch.py 251 s, down from 388 s since its tests share
#             their tuned tables; the two halves apart: pytest-ln, pytest-dispatch)
#   gtest     the C++ tests alone (every variant against the float64 reference)
#   bench     bench/layer_norm.py, torch.compile included (--no-compile with bench-quick)
#   examples  examples/evoformer.py with torch's LayerNorm and with --hfnn
#   profile   examples/evoformer.py under `hfnn profile`, against the same run without it
#   bench-profile  bench/profiler_cost.py: the profiler's overhead and agreement with torch.profiler on
#             the bf16 examples and the fp32 Evoformer ($BENCH_PROFILE_ARGS adds options)
#   profiler-parts  bench/profiler_cost.py --size small (launch-bound steps) with the collector's
#             parts switched off one at a time (HFNN_PROFILE_PARTS), the two joins (HFNN_CUPTI_JOIN) and
#             --sample 10 ($PARTS_CONFIGS, default transformer:bfloat16;
#             $PARTS_ROUNDS, default 3)
#   collector-cost  bench/collector_cost.py --device cuda: the profiler's CPU cost per op (each a kernel
#             launch) with the collector's parts one at a time and both joins, against torch.profiler
#   report-html  `hfnn profile --report html` of the bf16 transformer example: the page, for a look
#   torchrun  `hfnn profile -- torchrun` of the Evoformer example on every GPU (NCCL): one DB
#   tune-bench  bench/tune.py: hfnn tune's time per key and the stability of its winners
#   overhead  bench/dispatch_overhead.py: HFNN_DISPATCH_DB's CPU cost per LayerNorm call
#   e2e       bench/e2e.py: profile, tune, train with torch and with HFNN_DISPATCH_DB; one run per
#             config in $E2E_CONFIGS (default "float32 bfloat16"; float32-tf32 adds --tf32)
#   smoke     scripts/layer_norm_smoke.py: the variants in $SMOKE_VARIANTS at a few shapes against
#             float64, under a watchdog (a hang ends it in $SMOKE_TIMEOUT s, default 60, not the call)
#   pytest-k  only the Python tests that $PYTEST_K selects (pytest -k), verbose, with timings
#   e2e-multi bench/e2e.py under torchrun on every GPU of the machine
#   widths    tests/python/test_layer_norm_widths.py: every variant at every width (1 to 262,144)
#   sweep     bench/layer_norm_sweep.py: LayerNorm over 56 widths x 3 sizes x 3 dtypes, torch and
#             every variant ($SWEEP_CANDIDATES: others; $SWEEP_ARGS adds options)
#   ab        the sweep twice on this machine (scripts/device_ab.sh): with the baseline's op library
#             (.devbuild/base_libhfnn_ops.so.gz, from scripts/device_wheel.sh --baseline) swapped into
#             the installed package, results under $OUT/base, then with this build's, under $OUT/new
#   sweep-align  the same for the sweep's 12 widths with 4- or 8-byte rows alone, and its odd
#             widths in float32 (4-byte rows), to merge
#   sweep-compile  the same sweep's torch.compile candidates alone, to merge: 16M elements, every
#             width, unless $COMPILE_SIZES, $COMPILE_WIDTHS, $COMPILE_CANDIDATES say otherwise (e.g. 1M,
#             sweep, "compile default": the built-in choice beside it in the same run)
#   default-check  torch and the built-in choice at the sweep's widths and 41 between them
#             ($DEFAULT_WIDTHS: other --widths)
#   defaults-refresh  the sweep files in $REFRESH_PARTS merged into this GPU's committed sweep, the
#             built-in choice's data written from it, and default-check run with that data
#             (HFNN_LAYER_NORM_DEFAULTS) before it is compiled in
#   mha       bench/mha.py: nn.MultiheadAttention against hfnn's op with each attention core
#   lstm      bench/lstm.py: nn.LSTM (cuDNN) against every hfnn LSTM variant, the issue's configs
#             ($LSTM_ARGS adds options, e.g. --quick)
#   lstm-grid bench/lstm.py --grid: the hidden x batch crossover map in bf16 and fp32, and its SVG
#   e2e-lstm  bench/e2e.py --example lstm_lm: profile, tune, HFNN_DISPATCH_DB on the LSTM model
#             (fp32 and bf16)
#   e2e-mha   bench/e2e.py --example transformer: the same on the Transformer example in bf16, one run
#             per --config in $E2E_MHA_CONFIGS (default "2 1"), each under $E2E_MHA_TIMEOUT s (280)
#   pytest-lstm  tests/python/test_lstm.py with its GPU tests, verbose, with timings
#   lstm-phases  the persistent LSTM kernels' time per phase of a step (a test binary built with
#             scripts/device_wheel.sh --lstm-phases; each shape's line, then its phases)
#   lstm-steps  bench/lstm_steps.py: the persistent LSTM kernel's us per step (C++ timing test, 2 rounds;
#             $LSTM_STEPS_VERSION names the build in the records)
#   lstm-ab   bench/lstm_steps.py --ab $LSTM_AB_SWITCH: one build's environment switch at 1 and 0 in
#             turn ($LSTM_AB_ROUNDS each, default 2; $LSTM_AB_DTYPE: bfloat16 or float32 alone)
#   ncu-mha   Nsight Compute on hfnn_short's kernels (forward and backward of the second call) at
#             $MHA_NCU_CONFIG (default "5000 64 512 8", bf16), and each core's fwd+bwd time there;
#             $MHA_NCU_CORE another core (hfnn_mid), $MHA_NCU_KERNELS its kernels' regex (mid_bwd),
#             $MHA_NCU_SKIP / $MHA_NCU_COUNT the launches skipped and profiled (2 and 2)
#   ncu       Nsight Compute on the kernels of one call of each case in $NCU_CASES (space-separated
#             variant:dtype:shape, shape as ROWSxD, e.g. bwd_wide_c1:bfloat16:8192x2048); one log each;
#             $NCU_KERNELS: another regex of kernel names (e.g. param_cols_kernel, the *_cols variants' sums)
# The logs and plots end up in $OUT/logs.tar.gz (the device tool brings back at most 8 files): when
# it ends it packs and removes every *.log and *.svg in $OUT, a caller's too (a log written there by
# a command running beside it is lost: 2026-11-29), so a caller keeps its own logs elsewhere.
# It installs the wheel carried in .devbuild/ (scripts/device_wheel.sh, made on a CPU machine) when
# that imports with CUDA kernels, and otherwise builds from source with the packages in .deps/
# (scripts/device_prepare.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/hfnn-out}
mkdir -p "$OUT"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(tests bench examples)
want() { [[ " ${stages[*]} " == *" $1 "* ]]; }
export PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/env.txt"
python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/env.txt"
echo "host: $(nproc) CPUs, load average $(cut -d" " -f1-3 /proc/loadavg)" | tee -a "$OUT/env.txt"

# cuDNN for the C++ test binary (the LSTM variant cudnn_persistent): the copy torch's wheels install,
# the one torch itself loads (the op library finds it through torch).
if cudnn_lib=$(python3 -c "import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], 'lib'))" 2>/dev/null); then
  export LD_LIBRARY_PATH="$cudnn_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
installed_ok() { python3 -c "import hfnn, sys; sys.exit(0 if hfnn.build_info()['cuda_kernels'] else 1)" 2>/dev/null; }
# scripts/device_wheel.sh gzips the test binaries (the carry's size limit)
for gz in .devbuild/hfnn_kernel_tests*.gz; do
  [ -f "$gz" ] || continue
  gunzip -kf "$gz" && chmod +x "${gz%.gz}" || echo "could not unpack $gz: the stages that need it will say so"
done
wheel=$(ls .devbuild/hfnn-*.whl 2>/dev/null | head -n 1)
if [ -n "$wheel" ] && python3 -m pip install -q --no-deps --no-index --force-reinstall "$wheel" && installed_ok; then
  echo "installed carried wheel $wheel"
  installed_from="carried wheel"
  tests_bin=.devbuild/hfnn_kernel_tests
else
  echo "carried wheel missing or not loadable here: building from source"
  deps=$PWD/.deps/root/usr
  export SKBUILD_CMAKE_ARGS="-Dfmt_DIR=$deps/lib/x86_64-linux-gnu/cmake/fmt;-DGTest_DIR=$deps/lib/x86_64-linux-gnu/cmake/GTest;-DCLI11_DIR=$deps/share/cmake/CLI11;-Dnlohmann_json_DIR=$deps/share/cmake/nlohmann_json;-DHFNN_CUDA_ARCHITECTURES=90a-real"
  export CMAKE_BUILD_PARALLEL_LEVEL=16
  # The image's default compiler (/opt/gcc) links libstdc++ into the op library statically, and a
  # second libstdc++ beside torch's crashed formatting an error message (seen 2026-11-22: a
  # segfault in std::ostream::_M_insert<long> inside libhfnn_ops.so). The system g++ links it shared.
  if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
  rm -rf build/py3-none-*
  python3 -m pip install --no-build-isolation --no-deps --no-index . > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  installed_ok || { echo "hfnn built but has no CUDA kernels"; exit 1; }
  tests_bin=$(ls -d build/py3-none-*/hfnn_kernel_tests | head -n 1)
  installed_from="built here from source"
fi
python3 -c "import hfnn; print('hfnn', hfnn.__version__, hfnn.build_info())"

status=0
gpu=$(python3 -c "import torch; n=torch.cuda.get_device_name().lower(); print('h200' if 'h200' in n else 'h100' if 'h100' in n else n.split()[-1])")
if want tests; then
  "$tests_bin" --gtest_color=no 2>&1 | tee "$OUT/gtest.log" | grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|Failure|error" ; gtest_rc=${PIPESTATUS[0]}
  python3 -m pytest tests/python -q -p no:cacheprovider --durations=20 -o faulthandler_timeout=300 2>&1 | tee "$OUT/pytest.log" | tail -40; pytest_rc=${PIPESTATUS[0]}
  [ "$gtest_rc" -eq 0 ] && [ "$pytest_rc" -eq 0 ] || status=1
  # The record of this GPU test run (bench/results/tests-<gpu>.json).
  python3 - "$OUT/tests-$gpu.json" "$gtest_rc" "$pytest_rc" "$OUT/gtest.log" "$OUT/pytest.log" "$installed_from" <<'PY'
import datetime, json, pathlib, sys, torch, hfnn
out, gtest_rc, pytest_rc, gtest_log, pytest_log, installed_from = sys.argv[1:]
last = lambda path, key: next((l.strip() for l in reversed(pathlib.Path(path).read_text().splitlines()) if key in l), "")
pathlib.Path(out).write_text(json.dumps({
    "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "hfnn": hfnn.__version__,
    "date": datetime.date.today().isoformat(), "installed_from": installed_from,
    "gtest": {"exit_code": int(gtest_rc), "summary": last(gtest_log, "test suites ran")},
    "pytest": {"exit_code": int(pytest_rc), "summary": last(pytest_log, "passed")},
}, indent=1) + "\n")
PY
fi
if want gtest; then
  timeout ${GTEST_TIMEOUT:-300} "$tests_bin" --gtest_color=no 2>&1 | tee "$OUT/gtest.log" \
    | grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|error|Which is|Expected" | head -60; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if want tests-quick; then
  "$tests_bin" --gtest_color=no 2>&1 | tee "$OUT/gtest.log" | grep -E "^\[  (PASSED|FAILED) |Failure" || true
fi
quick_tests=()
if want tests-quick || want pytest-quick || want pytest-ln; then quick_tests+=(tests/python/test_layer_norm.py); fi
if want tests-quick || want pytest-quick || want pytest-dispatch; then quick_tests+=(tests/python/test_dispatch.py); fi
if (( ${#quick_tests[@]} )); then
  # (faulthandler_timeout: a test that hangs prints every thread's stack instead of nothing)
  timeout 540 python3 -m pytest "${quick_tests[@]}" -q -p no:cacheprovider \
    --durations=10 -o faulthandler_timeout=150 2>&1 | tee "$OUT/pytest-quick.log" | tail -20; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if want smoke; then
  timeout 400 python3 scripts/layer_norm_smoke.py --variants ${SMOKE_VARIANTS:?set SMOKE_VARIANTS} \
    --timeout ${SMOKE_TIMEOUT:-60} 2>&1 | tee "$OUT/smoke.log" | grep -v ": ok " | tail -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if want pytest-k; then
  timeout 480 python3 -m pytest tests/python -v -p no:cacheprovider -k "${PYTEST_K:?set PYTEST_K}" --durations=10 \
    -o faulthandler_timeout=150 2>&1 | tee "$OUT/pytest-k.log" | tail -40; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if want examples && [ -f examples/evoformer.py ]; then
  # One JSON and one log for all four runs: the device tool brings back at most 8 files.
  runs=$(mktemp -d)
  for dtype in float32 bfloat16; do
    for mode in torch hfnn; do
      flag=(); [ $mode = hfnn ] && flag=(--hfnn)
      python3 examples/evoformer.py "${flag[@]}" --dtype $dtype --steps 20 --warmup 5 --json "$runs/$mode-$dtype.json" \
        >> "$OUT/evoformer.log" 2>&1 || status=1
      echo "evoformer $dtype $mode: $(tail -n 1 "$OUT/evoformer.log")"
    done
  done
  python3 - "$runs" "$OUT/evoformer-$gpu.json" <<'PY'
import json, pathlib, sys, torch
runs = {p.stem: json.loads(p.read_text()) for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json"))}
meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
pathlib.Path(sys.argv[2]).write_text(json.dumps(dict(meta, runs=runs), indent=1) + "\n")
PY
fi
if want profile && [ -f examples/evoformer.py ]; then
  # The profiler on the GPU: the example under `hfnn profile` against the same run without it.
  runs=$(mktemp -d)
  python3 examples/evoformer.py --steps 20 --warmup 5 --json "$runs/plain.json" > "$OUT/profile.log" 2>&1 || status=1
  (cd "$OUT" && hfnn profile --db "$OUT/shapes.db" --warmup 5 --steps 20 --python "$(command -v python3)" \
     "$OLDPWD/examples/evoformer.py" --steps 20 --warmup 5 --json "$runs/profiled.json") >> "$OUT/profile.log" 2>&1 || status=1
  tail -30 "$OUT/profile.log"
  python3 -c "import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2])); print(f'median step: plain {a[\"median_step_ms\"]:.2f} ms, under hfnn profile {b[\"median_step_ms\"]:.2f} ms ({100*(b[\"median_step_ms\"]/a[\"median_step_ms\"]-1):+.1f}%)')" "$runs/plain.json" "$runs/profiled.json"
  ls -l "$OUT/shapes.db"
fi
if want bench-profile; then
  # The profiler's cost and its agreement with torch.profiler (bench/profiler_cost.py), one JSON
  # array, written after each config ($BENCH_PROFILE_ARGS: other configs, --mode, --rounds).
  timeout ${BENCH_PROFILE_TIMEOUT:-560} python3 bench/profiler_cost.py --out "$OUT/profile-$gpu.json" \
    ${BENCH_PROFILE_ARGS:-} > "$OUT/bench-profile.log" 2>&1 || status=1
  tail -20 "$OUT/bench-profile.log"
fi
if want profiler-parts; then
  # Where the profiler's cost on a launch-bound step goes: the modes differ in one part each.
  timeout ${PARTS_TIMEOUT:-400} python3 bench/profiler_cost.py --size small --rounds "${PARTS_ROUNDS:-3}" \
    --configs ${PARTS_CONFIGS:-transformer:bfloat16} --out "$OUT/profile-parts-$gpu.json" \
    --mode "HFNN_CUPTI_JOIN=callbacks" --mode "HFNN_PROFILE_PARTS=observer" --mode "HFNN_PROFILE_PARTS=no-cupti" \
    --mode "HFNN_PROFILE_PARTS=attached" --mode "HFNN_PROFILE_PARTS=kernels-only" \
    --mode "--sample 10" > "$OUT/profiler-parts.log" 2>&1 || status=1
  tail -12 "$OUT/profiler-parts.log"
fi
if want collector-cost; then
  timeout ${COLLECTOR_COST_TIMEOUT:-400} python3 bench/collector_cost.py --device cuda --workloads "${COLLECTOR_COST_WORKLOADS:-add,linear}" \
    --parts "${COLLECTOR_COST_PARTS:-observer,no-cupti,attached,kernels-only}" --joins callbacks --rounds "${COLLECTOR_COST_ROUNDS:-3}" \
    --repeats 3 --ops 30000 --out "$OUT/collector_cost-cuda-$gpu.json" > "$OUT/collector-cost.log" 2>&1 || status=1
  tail -12 "$OUT/collector-cost.log"
fi
if want report-html; then
  (cd "$OUT" && hfnn profile --db "$OUT/report.db" --report html --python "$(command -v python3)" \
     "$OLDPWD/examples/transformer.py" --dtype bfloat16) > "$OUT/report-html.log" 2>&1 || status=1
  tail -5 "$OUT/report-html.log"; ls "$OUT"
fi
if want torchrun; then
  # One profile of a data-parallel run on every GPU of this machine: both ranks in one DB.
  ngpu=$(nvidia-smi -L | wc -l)
  (cd "$OUT" && hfnn profile --db "$OUT/ddp.db" --warmup 5 --steps 20 --report text -- \
     python3 -m torch.distributed.run --nproc_per_node "$ngpu" "$OLDPWD/examples/evoformer.py" --steps 20 --warmup 5) \
     > "$OUT/torchrun.log" 2>&1 || status=1
  tail -40 "$OUT/torchrun.log"
  hfnn report --db "$OUT/ddp.db" --format json -o "$OUT/profile-torchrun-$gpu.json" || status=1
fi
if want tune-bench; then
  python3 bench/tune.py --out "$OUT/tune-$gpu.json" > "$OUT/tune-bench.log" 2>&1 || status=1
  tail -12 "$OUT/tune-bench.log"
fi
if want overhead; then
  python3 bench/dispatch_overhead.py --rounds 5 --out "$OUT/dispatch-overhead-$gpu.json" 2>&1 | tee "$OUT/overhead.log" | grep -E "^(round|overhead)"; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if want e2e; then
  for config in ${E2E_CONFIGS:-float32 bfloat16}; do
    opts=(--dtype "${config%-tf32}"); [[ $config == *-tf32 ]] && opts+=(--tf32)
    python3 bench/e2e.py "${opts[@]}" --out "$OUT/e2e-$gpu-$config.json" --plot "$OUT/e2e-$gpu-$config.svg" \
      > "$OUT/e2e-$config.log" 2>&1 || status=1
    tail -24 "$OUT/e2e-$config.log"
  done
fi
if want e2e-multi; then
  ngpu=$(nvidia-smi -L | wc -l)
  python3 bench/e2e.py --nproc "$ngpu" --out "$OUT/e2e-$gpu-x$ngpu.json" --plot "$OUT/e2e-$gpu-x$ngpu.svg" \
    > "$OUT/e2e-multi.log" 2>&1 || status=1
  tail -22 "$OUT/e2e-multi.log"
fi
if want widths; then
  # One process: four on the one GPU finished no test in 220 s (2026-11-27; likely the GPU's time
  # slicing between processes, which each of these small synchronizing calls then waits for).
  timeout ${WIDTHS_TIMEOUT:-560} python3 -m pytest tests/python/test_layer_norm_widths.py -q -p no:cacheprovider --durations=12 \
    -o faulthandler_timeout=300 2>&1 | tee "$OUT/widths.log" | tail -60; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
# The sweep into directory $1 (its JSON and its log).
sweep_to() {
  timeout ${SWEEP_TIMEOUT:-560} python3 -X faulthandler bench/layer_norm_sweep.py --out "$1/layer_norm_sweep-$gpu.json" \
    --candidates ${SWEEP_CANDIDATES:-torch variants} ${SWEEP_ARGS:-} \
    2>&1 | tee "$1/sweep.log" | grep -E "FAILED|wrote|^- |^  - |copy" | head -80; return "${PIPESTATUS[0]}"
}
if want sweep; then
  sweep_to "$OUT" || status=1
fi
if want ab; then
  # scripts/device_ab.sh swaps the libraries (and puts this build's back however it ends)
  AB_RUNS="base new" AB_TIMEOUT=${SWEEP_TIMEOUT:-560} AB_TAIL=${AB_TAIL:-40} OUT="$OUT" bash scripts/device_ab.sh \
    "python3 -X faulthandler bench/layer_norm_sweep.py --out \$AB_OUT/layer_norm_sweep-$gpu.json --candidates ${SWEEP_CANDIDATES:-torch variants} ${SWEEP_ARGS:-}" \
    || status=1
fi
if want sweep-align; then
  timeout ${SWEEP_TIMEOUT:-560} python3 -X faulthandler bench/layer_norm_sweep.py --out "$OUT/layer_norm_sweep-align-$gpu.json" \
    --candidates torch variants --widths align 2>&1 | tee "$OUT/sweep-align.log" | grep -E "FAILED|wrote|copy" | head -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  # float32 rows of odd widths are 4-byte aligned: the wide variants take them too
  timeout ${SWEEP_TIMEOUT:-560} python3 -X faulthandler bench/layer_norm_sweep.py --out "$OUT/layer_norm_sweep-odd32-$gpu.json" \
    --candidates torch variants --widths 33 127 255 1023 4097 12289 --dtypes float32 2>&1 | tee "$OUT/sweep-odd32.log" \
    | grep -E "FAILED|wrote|copy" | head -20; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if want default-check; then
  timeout ${SWEEP_TIMEOUT:-560} python3 -X faulthandler bench/layer_norm_sweep.py --out "$OUT/layer_norm_default-$gpu.json" \
    --candidates torch default --widths ${DEFAULT_WIDTHS:-sweep between} 2>&1 | tee "$OUT/default-check.log" \
    | grep -E "FAILED|wrote|^- |^  - |copy" | head -60; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if want defaults-refresh; then
  # The built-in choice's data made again on the GPU and checked before it is compiled in: the sweep
  # files in $REFRESH_PARTS (this GPU's, from `sweep` earlier in this call or carried) merged into
  # this copy of bench/results/layer_norm_sweep-$gpu.json, the data written from every GPU's sweep
  # as bench/README says, then default-check with it through HFNN_LAYER_NORM_DEFAULTS. Its files
  # come back under $OUT with "refresh" in their names (the merged sweep, the data, the check); here
  # `--defaults` of the same files must write the same bytes.
  sweep_file=bench/results/layer_norm_sweep-$gpu.json
  if [ ! -f "$sweep_file" ]; then
    echo "defaults-refresh: no committed sweep for this GPU ($sweep_file): sweep it whole first (stage sweep)"; status=1
  elif python3 bench/layer_norm_sweep.py --merge "$sweep_file" "$sweep_file" ${REFRESH_PARTS:-} \
      && python3 bench/layer_norm_sweep.py --defaults "$OUT/layer_norm_defaults-refresh.json" bench/results/layer_norm_sweep-*.json; then
    cp "$sweep_file" "$OUT/layer_norm_sweep-refresh-$gpu.json"
    HFNN_LAYER_NORM_DEFAULTS=$OUT/layer_norm_defaults-refresh.json timeout ${SWEEP_TIMEOUT:-560} python3 -X faulthandler \
      bench/layer_norm_sweep.py --out "$OUT/layer_norm_default-refresh-$gpu.json" --candidates torch default \
      --widths ${DEFAULT_WIDTHS:-sweep between} 2>&1 | tee "$OUT/default-check-refresh.log" \
      | grep -E "FAILED|wrote|^- |^  - |copy" | head -60; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  else
    echo "defaults-refresh: merging the parts (${REFRESH_PARTS:-none given}) into $sweep_file or writing the data failed"; status=1
  fi
fi
if want sweep-compile; then
  # COMPILE_SIZES, COMPILE_WIDTHS and COMPILE_CANDIDATES (default: torch.compile alone at 16M, every
  # width); `compile default` at 1M times the built-in choice beside it in the same run.
  tag=$(echo "${COMPILE_SIZES:-16M} ${COMPILE_WIDTHS:-sweep}" | tr ' ' '-')
  timeout ${COMPILE_TIMEOUT:-560} python3 -X faulthandler bench/layer_norm_sweep.py \
    --candidates ${COMPILE_CANDIDATES:-compile} --sizes ${COMPILE_SIZES:-16M} --widths ${COMPILE_WIDTHS:-sweep} \
    --compile-workers ${COMPILE_WORKERS:-14} --out "$OUT/layer_norm_sweep-compile-$tag-$gpu.json" 2>&1 \
    | tee "$OUT/sweep-compile-$tag.log" | grep -E "FAILED|wrote|compiled|copy" | tail -20
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if want ncu-mha; then
  cfg=${MHA_NCU_CONFIG:-5000 64 512 8}
  core=${MHA_NCU_CORE:-hfnn_short}
  python3 bench/mha_core_case.py --config $cfg --cores $core sdpa_efficient sdpa_cudnn --iters 5 2>&1 | tee "$OUT/mha-core.log"
  ncu --clock-control none -k regex:"${MHA_NCU_KERNELS:-short_}" --launch-skip ${MHA_NCU_SKIP:-2} --launch-count ${MHA_NCU_COUNT:-2} \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
    python3 bench/mha_core_case.py --config $cfg --cores $core --iters 1 > "$OUT/ncu-mha.log" 2>&1 || status=1
  grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Size|Grid Size|Waves Per SM|No Eligible|Active Warps Per Scheduler|Eligible Warps|Warp Cycles Per Issued|Issue Slots Busy|Shared Memory|Bank|Stall|stall|Executed Ipc|Compute \(SM\)" \
    "$OUT/ncu-mha.log" | head -90
fi
if want ncu; then
  for case in ${NCU_CASES:-bwd_wide_c1:bfloat16:8192x2048}; do
    IFS=: read -r variant dtype shape <<< "$case"
    # Two of hfnn's kernels after six warm-up launches: the 4th backward call's variant and partials'
    # reduction, or the 7th and 8th forward calls. Clocks as the benchmarks run them (no locking).
    ncu --clock-control none -k regex:"${NCU_KERNELS:-wide_kernel|regs_kernel|block_kernel|window_kernel|tma_kernel|reduce_partials}" --launch-skip 6 --launch-count 2 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
      --section WarpStateStats --section SchedulerStats \
      python3 bench/profile_variant.py --shape ${shape/x/ } --dtype "$dtype" --variant "$variant" --runs 8 \
      > "$OUT/ncu-$variant-$dtype-$shape.log" 2>&1 || status=1
    echo "== $case"; grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Block Size|Grid Size|Waves Per SM|No Eligible|Active Warps Per Scheduler|Eligible Warps|Warp Cycles Per Issued|Issue Slots Busy|L1/TEX Hit|L2 Hit|Stall|stall" \
      "$OUT/ncu-$variant-$dtype-$shape.log" | head -60
  done
fi
if want mha; then
  timeout ${MHA_TIMEOUT:-560} python3 bench/mha.py --out "$OUT/mha-$gpu.json" ${MHA_ARGS:-} 2>&1 | tee "$OUT/mha.log" | tail -60
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if want lstm-phases; then
  if [ -x .devbuild/hfnn_kernel_tests_phases ]; then
    timeout ${LSTM_TIMEOUT:-560} .devbuild/hfnn_kernel_tests_phases --gtest_also_run_disabled_tests \
      --gtest_filter='LstmKernels.DISABLED_PersistentTiming*' 2>&1 | grep -E "LSTM|PHASES" | tee "$OUT/lstm-phases.log" \
      | tail -40; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  else
    echo "lstm-phases: no .devbuild/hfnn_kernel_tests_phases: build it on the CPU machine with scripts/device_wheel.sh --lstm-phases and carry .devbuild"; status=1
  fi
fi
if want lstm-steps; then
  timeout ${LSTM_TIMEOUT:-560} python3 bench/lstm_steps.py --tests "$tests_bin" --version "${LSTM_STEPS_VERSION:-this build}" \
    --commit "$(git rev-parse --short HEAD 2>/dev/null || true)" --out "$OUT/lstm_persistent_steps-$gpu.json" \
    2>&1 | tee "$OUT/lstm-steps.log" | tail -40; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if want lstm-ab; then
  if [ -z "${LSTM_AB_SWITCH:-}" ]; then
    echo "lstm-ab: set LSTM_AB_SWITCH to the build's switch (an environment variable, e.g. HFNN_LSTM_BWD_MMA)"; status=1
  else
    timeout ${LSTM_TIMEOUT:-560} python3 bench/lstm_steps.py --tests "$tests_bin" --version "${LSTM_STEPS_VERSION:-this build}" \
      --commit "$(git rev-parse --short HEAD 2>/dev/null || true)" --ab "$LSTM_AB_SWITCH" --rounds "${LSTM_AB_ROUNDS:-2}" \
      ${LSTM_AB_DTYPE:+--dtype "$LSTM_AB_DTYPE"} --out "$OUT/lstm_ab-$gpu.json" \
      2>&1 | tee "$OUT/lstm-ab.log" | tail -70; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  fi
fi
if want lstm; then
  timeout ${LSTM_TIMEOUT:-560} python3 bench/lstm.py --out "$OUT/lstm-$gpu.json" ${LSTM_ARGS:-} 2>&1 | tee "$OUT/lstm.log" | tail -80
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if want lstm-grid; then
  timeout ${LSTM_TIMEOUT:-560} python3 bench/lstm.py --grid --dtypes bfloat16 float32 --out "$OUT/lstm_grid-$gpu.json" \
    --plot "$OUT/lstm_crossover-$gpu.svg" ${LSTM_GRID_ARGS:-} 2>&1 | tee "$OUT/lstm-grid.log" | tail -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if want e2e-lstm; then
  for dtype in float32 bfloat16; do
    python3 bench/e2e.py --example lstm_lm --dtype "$dtype" --out "$OUT/e2e-lstm-$gpu-$dtype.json" \
      --plot "$OUT/e2e-lstm-$gpu-$dtype.svg" > "$OUT/e2e-lstm-$dtype.log" 2>&1 || status=1
    tail -24 "$OUT/e2e-lstm-$dtype.log"
  done
fi
if want e2e-mha; then
  for cfg in ${E2E_MHA_CONFIGS:-2 1}; do
    timeout ${E2E_MHA_TIMEOUT:-280} python3 bench/e2e.py --example transformer --config "$cfg" --dtype bfloat16 \
      --out "$OUT/e2e-transformer-c$cfg-$gpu-bfloat16.json" --plot "$OUT/e2e-transformer-c$cfg-$gpu-bfloat16.svg" \
      > "$OUT/e2e-transformer-c$cfg.log" 2>&1 || status=1
    tail -30 "$OUT/e2e-transformer-c$cfg.log"
  done
fi
if want pytest-lstm; then
  timeout 560 python3 -m pytest tests/python/test_lstm.py -v -p no:cacheprovider --durations=12 -o faulthandler_timeout=300 \
    2>&1 | tee "$OUT/pytest-lstm.log" | tail -80; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if want bench || want bench-quick; then
  extra=(); want bench-quick && extra=(--no-compile)
  python3 bench/layer_norm.py --out "$OUT/layer_norm-$gpu.json" "${extra[@]}" 2>&1 | tee "$OUT/bench.log" | tail -70 || status=1
fi
(cd "$OUT" && mv env.txt env.log && tar czf logs.tar.gz ./*.log $(ls ./*.svg 2>/dev/null) && rm -f ./*.log ./*.svg)
exit $status
