#!/usr/bin/env python3
"""nn.MultiheadAttention per call, as a training loop sees it: torch's module against hfnn's op with
each attention core (torch's SDPA kernels called at the ATen level), forward and backward.

Per config x dtype x candidate x pass:
  wall_ms   per-call time of back-to-back calls, CPU launch cost included (median of rounds; the
            backward is fwd+bwd minus fwd, both timed so). The candidates' rounds are taken in
            turn (round 1 of each, then round 2, ...), so a host whose CPU speed drifts slows them
            alike
  graph_ms  per-call GPU time of the same calls captured in a CUDA graph and replayed (no CPU cost)
  cpu_us    process CPU time per call while launching them (every thread: the autograd engine's
            too)
Candidates: `torch` (the module, with the record's need_weights; True returns the weights averaged
over the heads, as the module's default does, and only the output is differentiated), hfnn's op
with each core that takes the shape (`sdpa_flash`, `sdpa_efficient`, `sdpa_cudnn`, `sdpa_math`,
`sdpa_auto` = torch's own pick), `hfnn`: the fastest of those by fwd+bwd wall time, which is
what `hfnn tune` will store, and `dispatch`: a plain nn.MultiheadAttention timed in a process of
its own under HFNN_DISPATCH_DB, with a table whose winner for the config's key is `hfnn`'s core
(the fastest named core where `hfnn` is sdpa_auto, which no table stores): the product's path, the
forward wrapper and the dispatch op's lookup and counting included. The table is made by hfnn's own
commands: `hfnn profile` of a few calls of the config records its key, and `hfnn tune` stores the
winner, with the tests' stand-in measuring worker (tests/python/scripts/fake_tune_worker.py) told
which core wins (so the stored winner is this benchmark's pick, not a second measurement). Its
record says `winner`, `dispatch_calls` (hfnn.dispatch_stats()'s counts in that process: the
core's calls, and the fall-backs to torch by reason) and `torch_total_same_process`: torch's own
path of the same module (the forward the dispatch wrapped) fwd+bwd ms in that process, its rounds
taken in turn with dispatch's (where a call is host-bound, processes and moments differ by up to 2x
on the GPU machines, so that is the ratio to quote), and `op_total_same_process`: hfnn's op called
directly with that core, in turn in the same process (what the routing costs). --no-dispatch leaves
it out. Every candidate
is first checked against float64 (outputs and every gradient within 4x the error of torch's module
in the same dtype).

    python3 bench/mha.py --out bench/results/mha-h200.json
    python3 bench/mha.py --configs 2 --out /tmp/mha-32.json     # [32, 128, 768, 12] bf16 alone
    python3 bench/mha.py --config 64 100 1280 20 --dtypes float16 --no-dispatch   # a shape of your own
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

import hfnn

CONFIGS = [  # [B, L, E, heads], dtypes
    ([200, 256, 1024, 16], ["bfloat16", "float32"]),
    ([5000, 64, 512, 8], ["bfloat16", "float32"]),
    ([32, 128, 768, 12], ["bfloat16"]),
    ([8, 1024, 1024, 16], ["bfloat16"]),
]
CORES = {"sdpa_auto": "", "sdpa_flash": "sdpa_flash", "sdpa_efficient": "sdpa_efficient",
         "sdpa_cudnn": "sdpa_cudnn", "sdpa_math": "sdpa_math", "hfnn_short": "hfnn_short",
         "hfnn_mid": "hfnn_mid"}
ROOT = Path(__file__).resolve().parents[1]
FAKE_WORKER = ROOT / "tests" / "python" / "scripts" / "fake_tune_worker.py"
# A few training calls of one config, for `hfnn profile` to record its attention key.
PROFILE_CALLS = r"""
import sys, torch, hfnn
from torch import nn
b, length, embed, heads, dtype = *map(int, sys.argv[1:5]), getattr(torch, sys.argv[5])
m = nn.MultiheadAttention(embed, heads, batch_first=True, device="cuda", dtype=dtype)
x = torch.randn(b, length, embed, device="cuda", dtype=dtype, requires_grad=True)
for _ in range(3):
    m(x, x, x, need_weights=False)[0].backward(torch.randn_like(x))
    hfnn.step()
torch.cuda.synchronize()
"""


# A candidate's call returns (output, the averaged weights or None).
def module_call(m, x, need_weights):
    return lambda: m(x, x, x, need_weights=need_weights)


def op_call(m, x, core, need_weights=False):
    if need_weights:
        return lambda: torch.ops.hfnn.multi_head_attention_with_weights(
            x, x, x, m.num_heads, m.in_proj_weight, m.in_proj_bias, m.out_proj.weight, m.out_proj.bias, True, False,
            0.0, core)
    return lambda: (torch.ops.hfnn.multi_head_attention(x, x, x, m.num_heads, m.in_proj_weight, m.in_proj_bias,
                                                        m.out_proj.weight, m.out_proj.bias, True, False, 0.0, core),
                    None)


def training_step(fn, grad, backward):
    """One call as a training loop makes it: forward, and the backward when timing it."""
    def step():
        out = fn()[0]
        if backward:
            out.backward(grad)
    return step


def calibrate(step, min_round_s):
    """Warms `step` up and returns how many back-to-back calls fill a round of min_round_s."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    return max(3, int(min_round_s / max(time.perf_counter() - t0, 1e-5)))


def timed_round(step, calls):
    """Per-call ms of `calls` back-to-back calls (to the GPU's finishing them), and CPU µs per call."""
    torch.cuda.synchronize()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(calls):
        step()
    c1 = time.process_time()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e3, (c1 - c0) / calls * 1e6


def interleaved_walls(fns, grad, min_round_s, rounds):
    """Median per-call ms over rounds of back-to-back calls, and CPU µs per call, of every
    candidate and pass, their rounds taken in turn (round r of every candidate, then round r + 1):
    the GPU machines' CPUs drift by up to 2x within minutes (seen on 2026-11-27: the same
    candidate 733 then 549 us a call), and a host-bound call's time is its CPU's, so candidates
    timed one after another compare their moments, not themselves. Returns
    {(name, backward): (median ms, median CPU us)}."""
    plans = {}
    for name, fn in fns.items():
        for backward in (False, True):
            step = training_step(fn, grad, backward)
            plans[(name, backward)] = (step, calibrate(step, min_round_s))
    samples = {key: [] for key in plans}
    for _ in range(rounds):
        for key, (step, calls) in plans.items():
            samples[key].append(timed_round(step, calls))
    return {key: (statistics.median(s[0] for s in v), statistics.median(s[1] for s in v)) for key, v in samples.items()}


def captured(step, leaves, calls):
    """A CUDA graph of `calls` back-to-back calls of `step`, after three on a side stream (the
    allocator's and the libraries' first-call work), the leaves' .grad cleared before the capture."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    for p in leaves:
        p.grad = None
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            step()
    return g


def graphed(fn, grad, backward, params, x):
    """Per-call GPU ms of `calls` steps captured in one CUDA graph, median of replays."""
    calls = 5
    g = captured(training_step(fn, grad, backward), [*params, x], calls)
    times = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    del g
    return statistics.median(times)


def rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


def errors(fn_of, m, x, grad):
    """max rel error of the output, every gradient and the returned weights (where the call returns
    them) against float64, for fn_of(module, input)."""
    m64 = nn.MultiheadAttention(m.embed_dim, m.num_heads, batch_first=True, device="cuda", dtype=torch.float64)
    m64.load_state_dict(m.state_dict())
    x64 = x.detach().double().requires_grad_()
    out64, weights64 = m64(x64, x64, x64, need_weights=True)
    ref = [out64] + list(torch.autograd.grad(out64, [x64] + list(m64.parameters()), grad.double()))
    xl = x.detach().requires_grad_()
    out, weights = fn_of(m, xl)()
    got = [out] + list(torch.autograd.grad(out, [xl] + list(m.parameters()), grad))
    if weights is not None:
        got, ref = got + [weights], ref + [weights64]
    return max(rel(a, b) for a, b in zip(got, ref))


def dispatch_table(db: Path, config, dtype_name: str, core: str) -> None:
    """A table whose winner for this config's key (training, self-attention, batch_first, bias) is
    `core`, for this GPU and these versions: hfnn profile, then hfnn tune with the stand-in worker."""
    b, length, embed, heads = config
    env = {k: v for k, v in os.environ.items() if not k.startswith("HFNN_")}

    def run(cmd, extra=None):
        out = subprocess.run(cmd, capture_output=True, text=True, env={**env, **(extra or {})})
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, cmd[:4]))}... failed ({out.returncode}): {out.stderr[-1500:]}")
        return out

    hfnn_cli = shutil.which("hfnn")
    run([hfnn_cli, "profile", "-q", "--db", str(db), "--warmup", "0", "--steps", "0", "--report", "none", "--",
         sys.executable, "-c", PROFILE_CALLS, str(b), str(length), str(embed), str(heads), dtype_name])
    props = torch.cuda.get_device_properties(0)
    run([hfnn_cli, "tune", "-q", "--db", str(db), "--ops", "multihead_attention", "--python", sys.executable],
        dict(HFNN_TUNE_WORKER=str(FAKE_WORKER), FAKE_TUNE_TORCH=torch.__version__, FAKE_TUNE_CUDA=torch.version.cuda or "",
             FAKE_TUNE_HFNN=hfnn.__version__, FAKE_TUNE_WINNER_TRAIN=core, FAKE_TUNE_GOOD_US="50",
             FAKE_TUNE_GPU=props.name, FAKE_TUNE_CC=f"{props.major}.{props.minor}",
             FAKE_TUNE_SMS=str(props.multi_processor_count)))


def dispatch_candidate(config, dtype_name: str, core: str, round_s: float, rounds: int) -> dict:
    """The `dispatch` candidate: a table won by `core`, then a process of its own timing a plain
    nn.MultiheadAttention under HFNN_DISPATCH_DB (this script's --dispatch-worker)."""
    work = Path(tempfile.mkdtemp(prefix="hfnn-mha-dispatch-"))
    try:
        db = work / "shapes.db"
        dispatch_table(db, config, dtype_name, core)
        env = {k: v for k, v in os.environ.items() if not k.startswith("HFNN_")}
        env["HFNN_DISPATCH_DB"] = str(db)
        out = subprocess.run([sys.executable, __file__, "--dispatch-worker", *map(str, config), dtype_name, core,
                              "--round-s", str(round_s), "--rounds", str(rounds)], capture_output=True, text=True,
                             env=env)
        if out.returncode != 0:
            raise RuntimeError(f"the dispatch worker failed ({out.returncode}): {out.stderr[-1500:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def dispatch_worker(config, dtype_name: str, core: str, round_s: float, rounds: int) -> int:
    """In a process started with HFNN_DISPATCH_DB: times a plain nn.MultiheadAttention as main()
    times the `torch` candidate, in turn with torch's own path of the same module and with hfnn's op
    called directly with the table's `core`, both in this process, and prints one JSON line with the
    three and what dispatch ran."""
    from hfnn import _dispatch

    b, length, embed, heads = config
    if not _dispatch.active or not hasattr(nn.MultiheadAttention.forward, "__wrapped__"):
        sys.exit("bench/mha.py --dispatch-worker: HFNN_DISPATCH_DB did not route nn.MultiheadAttention "
                 "(is hfnn's start-up hook installed with the package?)")
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    m = nn.MultiheadAttention(embed, heads, batch_first=True, device="cuda", dtype=dtype)
    x = torch.randn(b, length, embed, device="cuda", dtype=dtype, requires_grad=True)
    grad = torch.randn(b, length, embed, device="cuda", dtype=dtype)
    make = lambda mm, xx: module_call(mm, xx, False)  # noqa: E731
    err = errors(make, m, x, grad)
    torch.ops.hfnn.dispatch_reset_counts()  # (the float64 reference's call counted as a fall-back)
    fn = make(m, x)
    # torch's own module path in this process too (the forward HFNN_DISPATCH_DB wrapped), its rounds
    # taken in turn with dispatch's: a host-bound call's ratio from the same process and moments.
    unwrapped = nn.MultiheadAttention.forward.__wrapped__
    # hfnn's op called directly with the winning core, in turn too: what routing the module's call
    # through the table costs, without two processes' hosts in the ratio.
    walls = interleaved_walls({"torch": lambda: unwrapped(m, x, x, x, need_weights=False), "dispatch": fn,
                               "op": op_call(m, x, core)}, grad, round_s, rounds)
    (fwd_ms, fwd_cpu), (tot_ms, tot_cpu) = walls[("dispatch", False)], walls[("dispatch", True)]
    torch_total, op_total = walls[("torch", True)][0], walls[("op", True)][0]
    try:
        g_fwd = graphed(fn, grad, False, list(m.parameters()), x)
        g_tot = graphed(fn, grad, True, list(m.parameters()), x)
    except RuntimeError as e:  # a capture that fails leaves the wall times, which are what this measures
        print(f"bench/mha.py --dispatch-worker: CUDA graph capture failed: {str(e).splitlines()[0]}", file=sys.stderr)
        g_fwd = g_tot = None
    op = _dispatch.dispatch_stats()["ops"]["multihead_attention"]
    print(json.dumps({"fwd": [fwd_ms, g_fwd, fwd_cpu],
                      "bwd": [tot_ms - fwd_ms, None if g_tot is None else g_tot - g_fwd, tot_cpu - fwd_cpu],
                      "total": tot_ms, "torch_total": torch_total, "op_total": op_total, "error": err,
                      "calls": op["calls"]["train"], "fallbacks": op["fallbacks"]["train"]}))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write the records here (a JSON array)")
    ap.add_argument("--configs", type=int, nargs="*", help="indices into the config list (default: all)")
    ap.add_argument("--config", type=int, nargs=4, action="append", metavar=("B", "L", "E", "HEADS"),
                    help="a config of your own instead of the list (repeatable), in --dtypes")
    ap.add_argument("--dtypes", nargs="+", choices=["bfloat16", "float16", "float32"], default=["bfloat16"],
                    help="the dtypes of the --config configs (default: bfloat16)")
    ap.add_argument("--round-s", type=float, default=0.05, help="seconds per timing round")
    ap.add_argument("--rounds", type=int, default=7,
                    help="timing rounds per candidate and pass, taken in turn across the candidates (default 7)")
    ap.add_argument("--no-dispatch", action="store_true", help="leave out the `dispatch` candidate")
    ap.add_argument("--need-weights", choices=["false", "true", "both"], default="both",
                    help="need_weights=False calls (every config and dtype), need_weights=True calls (the 16-bit "
                         "configs: the module returning the head-averaged weights against hfnn's op with the "
                         "cores that return them), or both (default)")
    ap.add_argument("--dispatch-worker", nargs=6, metavar=("B", "L", "E", "HEADS", "DTYPE", "CORE"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rounds < 1 or args.round_s <= 0:
        sys.exit(f"bench/mha.py: --rounds {args.rounds} --round-s {args.round_s}: both must be positive")
    if args.config:
        bad = [c for c in args.config if min(c) < 1 or c[2] % c[3] != 0]
        if bad:
            sys.exit(f"bench/mha.py: --config {' '.join(map(str, bad[0]))}: B, L, E and HEADS must be positive and E "
                     "a multiple of HEADS")
        configs = [(c, args.dtypes) for c in args.config]
    else:
        configs = [CONFIGS[i] for i in args.configs] if args.configs else CONFIGS
    if not torch.cuda.is_available():
        sys.exit("bench/mha.py: needs a CUDA GPU")
    if args.dispatch_worker:
        *config, dtype_name, core = args.dispatch_worker
        return dispatch_worker([int(v) for v in config], dtype_name, core, args.round_s, args.rounds)
    dispatch = not args.no_dispatch and shutil.which("hfnn") is not None
    if not args.no_dispatch and not dispatch:
        print("bench/mha.py: the hfnn command is not on PATH, so no `dispatch` candidate (run scripts/setup.sh)",
              flush=True)
    variants_in_build = set(hfnn.build_info().get("variants", {}).get("multihead_attention", {}).get("train", []))
    gpu = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    records = []
    weight_modes = {"false": [False], "true": [True], "both": [False, True]}[args.need_weights]
    runs = [(config, dtype_name, nw) for nw in weight_modes for config, dtypes in configs for dtype_name in dtypes
            if not nw or dtype_name != "float32"]
    for (b, length, embed, heads), dtype_name, nw in runs:
        dtype = getattr(torch, dtype_name)
        torch.manual_seed(0)
        m = nn.MultiheadAttention(embed, heads, batch_first=True, device="cuda", dtype=dtype)
        x = torch.randn(b, length, embed, device="cuda", dtype=dtype, requires_grad=True)
        grad = torch.randn(b, length, embed, device="cuda", dtype=dtype)
        params = list(m.parameters())
        cands = {"torch": lambda mm, xx: module_call(mm, xx, nw)}
        for name, core in CORES.items():
            if torch.ops.hfnn.multi_head_attention_supports(x, x, x, heads, True, False, 0.0, core, need_weights=nw):
                cands[name] = (lambda c: (lambda mm, xx: op_call(mm, xx, c, nw)))(core)
        err_torch = errors(cands["torch"], m, x, grad)
        fns = {name: make(m, x) for name, make in cands.items()}
        walls = interleaved_walls(fns, grad, args.round_s, args.rounds)
        rows = {}
        for name, make in cands.items():
            err = errors(make, m, x, grad)
            ok = err <= max(4 * err_torch, 1e-6)
            fn = fns[name]
            (fwd_ms, fwd_cpu), (tot_ms, tot_cpu) = walls[(name, False)], walls[(name, True)]
            g_fwd = graphed(fn, grad, False, params, x)
            g_tot = graphed(fn, grad, True, params, x)
            rows[name] = dict(fwd=(fwd_ms, g_fwd, fwd_cpu), bwd=(tot_ms - fwd_ms, g_tot - g_fwd, tot_cpu - fwd_cpu),
                              total=tot_ms, error=err, ok=ok)
            print(f"[{b}, {length}, {embed}, {heads}] {dtype_name}{' weights' if nw else ''} {name:15s} "
                  f"err {err:.1e}{'' if ok else ' REJECTED'}"
                  f"  wall fwd {fwd_ms:7.3f} bwd {tot_ms - fwd_ms:7.3f} ms  graph fwd {g_fwd:7.3f} "
                  f"bwd {g_tot - g_fwd:7.3f} ms  cpu fwd {fwd_cpu:6.0f} bwd {tot_cpu - fwd_cpu:6.0f} us", flush=True)
        del fns
        torch.cuda.empty_cache()
        variants = {k: v for k, v in rows.items() if k != "torch" and v["ok"]}
        if variants:
            best = min(variants, key=lambda k: variants[k]["total"])
            rows["hfnn"] = dict(rows[best], winner=best)
            print(f"  -> hfnn = {best}: fwd+bwd {rows['torch']['total'] / rows[best]['total']:.2f}x torch", flush=True)
            named = {k: v for k, v in variants.items() if CORES.get(k) in variants_in_build}
            if dispatch and named and not nw:
                core = best if best in named else min(named, key=lambda k: named[k]["total"])
                try:
                    d = dispatch_candidate([b, length, embed, heads], dtype_name, core, args.round_s, args.rounds)
                except (RuntimeError, ValueError) as e:
                    print(f"  dispatch: not measured: {e}", flush=True)
                else:
                    rows["dispatch"] = dict(fwd=tuple(d["fwd"]), bwd=tuple(d["bwd"]), total=d["total"],
                                            error=d["error"], ok=d["error"] <= max(4 * err_torch, 1e-6),
                                            winner=core, torch_total_same_process=round(d["torch_total"], 4),
                                            op_total_same_process=round(d["op_total"], 4),
                                            dispatch_calls=dict(d["calls"], **{
                                                f"torch because {k}": n for k, n in d["fallbacks"].items()}))
                    gf, gb = d["fwd"][1], d["bwd"][1]
                    graph = "" if gf is None else f"  graph fwd {gf:7.3f} bwd {gb:7.3f} ms"
                    print(f"[{b}, {length}, {embed}, {heads}] {dtype_name} {'dispatch':15s} err {d['error']:.1e}"
                          f"  wall fwd {d['fwd'][0]:7.3f} bwd {d['bwd'][0]:7.3f} ms{graph}  cpu fwd {d['fwd'][2]:6.0f} "
                          f"bwd {d['bwd'][2]:6.0f} us  ({core}; calls {d['calls']}, fall-backs {d['fallbacks']})",
                          flush=True)
                    print(f"  -> dispatch: fwd+bwd {rows['torch']['total'] / d['total']:.2f}x torch, "
                          f"{d['torch_total'] / d['total']:.2f}x torch's path timed in turn in its own process; "
                          f"the op's own call there {d['torch_total'] / d['op_total']:.2f}x torch's path, the "
                          f"dispatched call {d['total'] / d['op_total']:.3f}x the op's time",
                          flush=True)
        for name, r in rows.items():
            for p in ("fwd", "bwd"):
                w, g, c = r[p]
                rec = dict(gpu=gpu, torch=torch.__version__, date=date, config=[b, length, embed, heads],
                           dtype=dtype_name, need_weights=nw, **{"pass": p}, candidate=name,
                           wall_ms=round(w, 4), graph_ms=None if g is None else round(g, 4), cpu_us=round(c, 1),
                           max_rel_error=r["error"], correct=r["ok"])
                for extra in ("winner", "torch_total_same_process", "op_total_same_process", "dispatch_calls"):
                    if extra in r:
                        rec[extra] = r[extra]
                records.append(rec)
        del m, x, grad
        torch.cuda.empty_cache()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(records, indent=1) + "\n")
        print(f"wrote {len(records)} records to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
