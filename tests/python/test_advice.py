"""The reports' Advice section (profiles/advice.h): each rule on a run that triggers it and on one
that does not, checked in the JSON fields, the text and the HTML section. Real CPU training runs
(AdamW as a for-loop and with foreach=True; GEMMs off and on the tensor-core multiples, with TF32
off and allowed; LayerNorm and nn.MultiheadAttention); the GPU rules on copies of their databases
given the CUDA numbers a GPU run would have, and hfnn tune's results from its stand-in worker. One
GPU run checks what only a GPU records (copies to the host, GEMMs' CUDA time); it skips without one."""
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HFNN = shutil.which("hfnn")
pytestmark = pytest.mark.skipif(HFNN is None, reason="the hfnn executable is not on PATH: run scripts/setup.sh")

TRAIN = """
import sys
import torch

steps, optimizer = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.AdamW(model.parameters(), foreach=optimizer == "foreach")
for _ in range(steps):
    model(torch.randn(8, 16)).square().mean().backward()
    opt.step()
    opt.zero_grad()
"""
LOOP_RUN, FOREACH_RUN = 1, 2


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """A database with run 1 (AdamW's for-loop) and run 2 (foreach=True), 4 steps each after 2 warm-up."""
    tmp = tmp_path_factory.mktemp("advice")
    script = tmp / "train.py"
    script.write_text(TRAIN)
    db = tmp / "shapes.db"
    for optimizer in ("loop", "foreach"):
        out = subprocess.run([HFNN, "profile", "-q", "--db", str(db), "--python", sys.executable, "--warmup", "2",
                              "--steps", "4", str(script), "6", optimizer], capture_output=True, text=True, timeout=120,
                             cwd=tmp)
        assert out.returncode == 0, out.stderr
    return db


def reports(db, run):
    """The run's report as (JSON, text, HTML)."""
    def report(fmt):
        out = subprocess.run([HFNN, "report", "--db", str(db), "--run", str(run), "--format", fmt], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    return json.loads(report("json")), report("text"), report("html")


def advice(data, rule):
    found = [a for a in data["advice"] if a["id"] == rule]
    return found[0] if found else None


def assert_shown(rule, data, text, html):
    """The rule's advice is in all three reports, with its evidence."""
    a = advice(data, rule)
    assert a is not None, data["advice"]
    assert set(a) == {"id", "title", "action", "evidence", "saving_ms", "saving_note", "severity"}
    assert a["title"] and a["action"] and a["evidence"] and a["saving_note"]
    assert f"[{rule}]" in text and "Advice (most important first)" in text
    assert a["evidence"] in text and a["action"] in text
    assert '<h2 id="advice">Advice</h2>' in html and f'<li id="advice-{rule}">' in html
    return a


def assert_not_shown(rule, data, text, html):
    assert advice(data, rule) is None, data["advice"]
    assert f"[{rule}]" not in text and f'id="advice-{rule}"' not in html
    assert rule in data["advice_rules"]


def gpu_copy(db, tmp_path, statements):
    """A copy of the foreach run's database given a GPU run's numbers by `statements`."""
    copy = tmp_path / "gpu.db"
    shutil.copy(db, copy)
    with sqlite3.connect(copy) as con:
        for s in statements:
            con.execute(s)
    return copy


def test_for_loop_optimizer_is_told_to_use_foreach_or_fused(profiled):
    data, text, html = reports(profiled, LOOP_RUN)
    a = assert_shown("optimizer_foreach", data, text, html)
    assert "AdamW" in a["title"] and "fused=True" in a["action"] and "aten::addcdiv_ 4" in a["evidence"]  # 4 parameters
    with sqlite3.connect(profiled) as con:
        ((optimizer_us,),) = con.execute("SELECT sum(cpu_total_us) FROM op_stats WHERE run_id = ? AND name LIKE"
                                         " 'Optimizer.step#%'", (LOOP_RUN,)).fetchall()
    assert a["saving_ms"] == pytest.approx(optimizer_us / 4 / 1e3) and "upper bound" in a["saving_note"]
    assert "(no plain step)" in a["evidence"] and "no plain step to scale it to" in a["saving_note"]


def test_the_optimizer_saving_is_scaled_to_the_plain_step(profiled, tmp_path):
    # The optimizer step's CPU time is measured under the profiler, which pays the observer for each
    # of its ops: with a plain step half the recorded one, the saving is half that time, as the
    # other rules take the plain step. A plain step longer than the recorded one (host noise)
    # scales nothing.
    with sqlite3.connect(profiled) as con:
        ((optimizer_us,),) = con.execute("SELECT sum(cpu_total_us) FROM op_stats WHERE run_id = ? AND name LIKE"
                                         " 'Optimizer.step#%'", (LOOP_RUN,)).fetchall()
        walls = [w for (w,) in con.execute("SELECT wall_ms FROM step_stats WHERE run_id = ?", (LOOP_RUN,))]
    under_ms = optimizer_us / 4 / 1e3

    def with_plain_step(share):  # a plain step `share` of the recorded one (its median, as the reports take it)
        return ["UPDATE runs SET plain_steps_requested = 10",
                f"UPDATE ranks SET plain_steps = 10, plain_step_ms = {share * statistics.median(walls)!r}"]

    data, text, html = reports(gpu_copy(profiled, tmp_path, with_plain_step(0.5)), LOOP_RUN)
    a = assert_shown("optimizer_foreach", data, text, html)
    assert data["profiler_cost"]["plain_step_ms"] / data["profiler_cost"]["profiled_step_ms"] == pytest.approx(0.5)
    assert a["saving_ms"] == pytest.approx(under_ms * 0.5, rel=1e-6)
    assert "(x0.50)" in a["saving_note"] and "scaled to the plain step" in a["saving_note"]
    assert f"took {under_ms:.2f} ms of CPU a step under the profiler, about {under_ms * 0.5:.2f} ms without it" in (
        a["evidence"])
    data, text, html = reports(gpu_copy(profiled, tmp_path, with_plain_step(3.0)), LOOP_RUN)
    a = assert_shown("optimizer_foreach", data, text, html)
    assert a["saving_ms"] == pytest.approx(under_ms) and "(x1.00)" in a["saving_note"]


def test_foreach_optimizer_and_a_cpu_run_get_no_advice(profiled):
    data, text, html = reports(profiled, FOREACH_RUN)
    assert data["advice"] == []
    for rule in data["advice_rules"]:
        assert_not_shown(rule, data, text, html)
    assert "Advice: none" in text and "optimizer_foreach" in text and "<p>None:" in html
    # AdamW reads its CPU step counter with .item(): on the CPU that is no host-device sync.
    with sqlite3.connect(profiled) as con:
        assert con.execute("SELECT sum(calls) FROM op_stats WHERE run_id = 2 AND name = 'aten::_local_scalar_dense'"
                           ).fetchone()[0] > 0


def _busy_and_launches(busy_share, launches_per_ms):
    return [f"UPDATE step_stats SET gpu_busy_ms = {busy_share} * wall_ms",
            "INSERT INTO kernel_stats(run_id, rank, name, calls, cuda_us) SELECT run_id, 0, 'k', "
            f"CAST({launches_per_ms} * sum(wall_ms) AS INTEGER), 1 FROM step_stats WHERE run_id = 2"]


def test_cpu_bound_step_with_many_launches_is_told_to_launch_less(profiled, tmp_path):
    db = gpu_copy(profiled, tmp_path, _busy_and_launches(0.3, 50))
    data, text, html = reports(db, FOREACH_RUN)
    a = assert_shown("cpu_bound_launches", data, text, html)
    assert "busy 30%" in a["title"] and "CUDA graph" in a["action"] and "torch.compile" in a["action"]
    rate = float(re.search(r"\(([0-9.]+) a ms of step", a["evidence"]).group(1))
    assert rate == pytest.approx(50, abs=0.5)  # launches rounded to whole calls
    step = data["steps"][0]["mean_ms"]
    assert a["saving_ms"] == pytest.approx(0.7 * step) and "upper bound" in a["saving_note"]
    assert "under the profiler (no plain step)" in a["evidence"] and "no plain step" in a["saving_note"]
    assert "Saving: up to" in text and data["advice"][0]["id"] == "cpu_bound_launches"  # the step's bound comes first
    assert_not_shown("gpu_idle_host_work", data, text, html)


def _plain_step(share_of_profiled):
    """The run as if the script had gone on: a plain step `share_of_profiled` of the recorded step."""
    return ["UPDATE runs SET plain_steps_requested = 10",
            "UPDATE ranks SET plain_steps = 10, plain_step_ms = (SELECT ? * avg(wall_ms) FROM step_stats"
            " WHERE step_stats.run_id = ranks.run_id AND step_stats.rank = ranks.rank)".replace("?", str(share_of_profiled))]


def test_the_gpu_busy_share_is_of_the_plain_step(profiled, tmp_path):
    # Issue 13: a GPU busy 30% of the step under the profiler, which stretched the step to twice its
    # plain length: 60% of the plain step, still CPU-bound; the evidence and the saving are of the
    # plain step.
    db = gpu_copy(profiled, tmp_path, _busy_and_launches(0.3, 50) + _plain_step(0.5))
    data, text, html = reports(db, FOREACH_RUN)
    a = assert_shown("cpu_bound_launches", data, text, html)
    plain = data["profiler_cost"]["plain_step_ms"]
    busy = data["steps"][0]["gpu_busy_ms"]
    assert "busy 60%" in a["title"] and f"of a {plain:.2f} ms step without the profiler" in a["evidence"]
    assert a["saving_ms"] == pytest.approx(plain - busy) and "plain step" in a["saving_note"]
    rate = float(re.search(r"\(([0-9.]+) a ms of step", a["evidence"]).group(1))
    assert rate == pytest.approx(100, abs=1)  # 50 launches a ms of the step under the profiler: 100 without it
    assert data["steps"][0]["gpu_busy_share"] == pytest.approx(busy / plain) and "(60% of the plain step)" in text
    # The same GPU busy time, of a plain step it fills 90% of: not CPU-bound, though it looked so.
    data, text, html = reports(gpu_copy(profiled, tmp_path, _busy_and_launches(0.3, 50) + _plain_step(0.3 / 0.9)),
                               FOREACH_RUN)
    assert_not_shown("cpu_bound_launches", data, text, html)
    assert_not_shown("gpu_idle_host_work", data, text, html)


def test_idle_gpu_with_few_launches_points_at_host_work_instead(profiled, tmp_path):
    data, text, html = reports(gpu_copy(profiled, tmp_path, _busy_and_launches(0.3, 2)), FOREACH_RUN)
    a = assert_shown("gpu_idle_host_work", data, text, html)
    assert "DataLoader" in a["action"]
    assert_not_shown("cpu_bound_launches", data, text, html)


def test_a_run_that_puts_nothing_on_the_gpu_is_not_told_the_gpu_idles(profiled, tmp_path):
    """A CPU-only script on a machine with a GPU: the steps have a GPU busy time (0) but no kernel, copy
    or memset was launched. Seen on an H100: test_foreach_optimizer_and_a_cpu_run_get_no_advice got
    gpu_idle_host_work ("only 0 kernel launches a step"), which tells a user to hunt for host work
    between launches that do not exist."""
    data, text, html = reports(gpu_copy(profiled, tmp_path, ["UPDATE step_stats SET gpu_busy_ms = 0"]), FOREACH_RUN)
    assert_not_shown("gpu_idle_host_work", data, text, html)
    assert_not_shown("cpu_bound_launches", data, text, html)
    assert data["advice"] == []


def test_gpu_bound_step_is_not_called_cpu_bound(profiled, tmp_path):
    data, text, html = reports(gpu_copy(profiled, tmp_path, _busy_and_launches(0.95, 50)), FOREACH_RUN)
    assert_not_shown("cpu_bound_launches", data, text, html)
    assert_not_shown("gpu_idle_host_work", data, text, html)


def test_item_on_a_cuda_tensor_is_a_sync_to_remove(profiled, tmp_path):
    # A GPU run: every op with some CUDA time, .item()'s copy from the GPU included.
    db = gpu_copy(profiled, tmp_path, ["UPDATE op_stats SET cuda_self_us = 1, cuda_total_us = 1"])
    data, text, html = reports(db, FOREACH_RUN)
    a = assert_shown("host_device_sync", data, text, html)
    assert "aten::_local_scalar_dense" in a["evidence"] and ".item()" in a["evidence"] and a["saving_ms"] is None
    assert "not estimated" in text


def test_cast_traffic_over_the_threshold_is_told_to_keep_weights_in_the_compute_dtype(profiled, tmp_path):
    def run(cast_share):
        # Every op 10 µs of CUDA self time; aten::_to_copy (with its copy_ kernels) made `cast_share` of it.
        db = gpu_copy(profiled, tmp_path, [
            "UPDATE op_stats SET cuda_self_us = 10, cuda_total_us = 10",
            f"UPDATE op_stats SET cuda_total_us = {cast_share} * (SELECT 10.0 * count(*) FROM op_stats WHERE run_id = 2)"
            " / (SELECT count(*) FROM op_stats WHERE run_id = 2 AND name = 'aten::_to_copy')"
            " WHERE run_id = 2 AND name = 'aten::_to_copy'"])
        with sqlite3.connect(db) as con:
            (cast_us,) = con.execute("SELECT sum(cuda_total_us) FROM op_stats WHERE run_id = 2 AND name = 'aten::_to_copy'"
                                     ).fetchone()
        return cast_us, reports(db, FOREACH_RUN)

    cast_us, (data, text, html) = run(0.3)
    a = assert_shown("autocast_casts", data, text, html)
    assert "30%" in a["title"] and "bf16" in a["action"] and "aten::_to_copy" in a["evidence"]
    assert a["saving_ms"] == pytest.approx(cast_us / 4 / 1e3)
    _, (data, text, html) = run(0.05)
    assert_not_shown("autocast_casts", data, text, html)


# GEMMs, TF32, syncs, SDPA and hfnn tune: a second database of two small CPU runs, each given a
# GPU run's numbers by SQL as above. Run 1: float32 GEMMs with TF32 off and bfloat16 ones, both
# off the tensor-core multiples, and torch.cuda.synchronize() a step; run 2: float32 GEMMs on the
# multiples with TF32 allowed, LayerNorm and nn.MultiheadAttention (keys hfnn tune would time).
TRAIN_MORE = """
import sys
import torch
from torch import nn

steps, width, dtypes = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(",")
tf32, attention = sys.argv[4] == "tf32", sys.argv[5] == "attention"
if tf32:
    torch.backends.cuda.matmul.fp32_precision = "tf32"  # the collector records it with each float32 GEMM
torch.manual_seed(0)
mlps = [nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, 8)).to(getattr(torch, d))
        for d in dtypes]
norm, att = nn.LayerNorm(width), nn.MultiheadAttention(width, 2, batch_first=True)
opt = torch.optim.SGD([p for m in (*mlps, norm, att) for p in m.parameters()], lr=0.01)
for _ in range(steps):
    loss = sum(m(torch.randn(16, width, dtype=m[0].weight.dtype)).float().square().mean() for m in mlps)
    if attention:
        x = norm(torch.randn(4, 16, width))
        loss = loss + att(x, x, x, need_weights=False)[0].square().mean()
    loss.backward()
    try:
        torch.cuda.synchronize()  # raises without a GPU; the start-up hook's scope records the call all the same
    except (AssertionError, RuntimeError):
        pass
    opt.step()
    opt.zero_grad()
"""
OFF_MULTIPLE_RUN, ATTENTION_RUN = 1, 2
FAKE_WORKER = Path(__file__).parent / "scripts" / "fake_tune_worker.py"


@pytest.fixture(scope="module")
def more(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("advice-more")
    (tmp / "train.py").write_text(TRAIN_MORE)
    db = tmp / "shapes.db"
    for args in (["30", "float32,bfloat16", "ieee", "none"], ["32", "float32", "tf32", "attention"]):
        out = subprocess.run([HFNN, "profile", "-q", "--db", str(db), "--python", sys.executable, "--warmup", "2",
                              "--steps", "4", str(tmp / "train.py"), "6", *args], capture_output=True, text=True,
                             timeout=120, cwd=tmp)
        assert out.returncode == 0, out.stderr
    return db


def as_gpu_run(db, tmp_path, run, gemm_share=0.0, gemm_dtype="float32", gpu="NVIDIA H200", cc="9.0",
               more_statements=()):
    """A copy of `db` whose run `run` ran on `gpu`: every op 10 µs of CUDA time, the GEMMs in
    `gemm_dtype` `gemm_share` of it together (the others none), the GPU busy 2 ms a step, every
    other recorded shape (each LayerNorm and attention key) 5% of that."""
    ops_us = f"(SELECT 10.0 * count(*) FROM op_stats WHERE run_id = {run})"
    gemms = f"run_id = {run} AND op = 'gemm' AND dtype = '{gemm_dtype}'"
    copy = tmp_path / f"gpu-{run}.db"
    shutil.copy(db, copy)
    with sqlite3.connect(copy) as con:
        con.execute("UPDATE runs SET gpu = ?, compute_capability = ?, sm_count = 132 WHERE id = ?", (gpu, cc, run))
        con.execute("UPDATE op_stats SET cuda_self_us = 10, cuda_total_us = 10 WHERE run_id = ?", (run,))
        con.execute(f"UPDATE shape_stats SET cuda_total_us = 0 WHERE run_id = {run} AND op = 'gemm'")
        con.execute(f"UPDATE shape_stats SET cuda_total_us = {gemm_share} * {ops_us} / (SELECT count(*) FROM shape_stats"
                    f" WHERE {gemms}) WHERE {gemms}")
        con.execute("UPDATE step_stats SET gpu_busy_ms = 2 WHERE run_id = ?", (run,))
        con.execute(f"UPDATE shape_stats SET cuda_total_us = 0.05 * 1e3 * (SELECT sum(gpu_busy_ms) FROM step_stats WHERE"
                    f" run_id = {run}) / (SELECT count(*) FROM shape_stats s WHERE s.run_id = {run} AND s.op ="
                    f" shape_stats.op AND s.shape = shape_stats.shape AND s.dtype = shape_stats.dtype AND s.flags ="
                    f" shape_stats.flags) WHERE run_id = {run} AND op != 'gemm'")
        for s in more_statements:
            con.execute(s)
    return copy


def gemm_rows(db, run):
    with sqlite3.connect(db) as con:
        return con.execute("SELECT shape, dtype, phase, flags, sum(calls) FROM shape_stats WHERE run_id = ? AND op ="
                           " 'gemm' GROUP BY shape, dtype, phase, flags", (run,)).fetchall()


def test_gemm_shapes_are_recorded_with_the_tf32_setting_they_ran_under(more):
    # Linear(30, 60) on [16, 30]: addmm M=16, N=60, K=30; its backward: the weight's gradient
    # [60, 16] x [16, 30] (M=60, N=30, K=16); Linear(60, 8) also the input's gradient.
    rows = {(shape, dtype, phase): (flags, calls) for shape, dtype, phase, flags, calls in gemm_rows(more, OFF_MULTIPLE_RUN)}
    assert rows[("[16,60,30]", "float32", "fwd")] == ("op=addmm,tf32=0", 4)  # 4 recorded steps
    assert rows[("[60,30,16]", "float32", "bwd")][0] == "op=mm,tf32=0" and ("[16,60,8]", "float32", "bwd") in rows
    assert rows[("[16,60,30]", "bfloat16", "fwd")] == ("op=addmm", 4)  # TF32 is float32's only
    assert {flags for _, dtype, _, flags, _ in gemm_rows(more, ATTENTION_RUN)} >= {"op=addmm,tf32=1", "op=mm,tf32=1"}
    # Shapes for the advice only: the report lists them, hfnn tune does not offer to tune them.
    data, _, _ = reports(more, OFF_MULTIPLE_RUN)
    assert any(s["op"] == "gemm" and s["shape"] == "[16,60,30]" for s in data["shapes"])
    out = subprocess.run([HFNN, "tune", "--db", str(more), "--run", str(OFF_MULTIPLE_RUN), "--dry-run"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "gemm:" not in out.stdout and "copy_to_host" not in out.stdout and "no variants" not in out.stdout


def test_fp32_matmuls_without_tf32_on_an_ampere_or_newer_gpu_are_told_to_allow_it(more, tmp_path):
    db = as_gpu_run(more, tmp_path, OFF_MULTIPLE_RUN, gemm_share=0.5)
    data, text, html = reports(db, OFF_MULTIPLE_RUN)
    a = assert_shown("tf32_matmuls", data, text, html)
    assert "50%" in a["title"] and 'fp32_precision = "tf32"' in a["action"]
    assert "NVIDIA H200 (sm 9.0)" in a["evidence"] and re.search(r"\[M=\d+,N=\d+,K=\d+\] float32 (addmm|mm)", a["evidence"])
    with sqlite3.connect(db) as con:
        (gemm_us,) = con.execute("SELECT sum(cuda_total_us) FROM shape_stats WHERE run_id = ? AND op = 'gemm'",
                                 (OFF_MULTIPLE_RUN,)).fetchone()
    assert a["saving_ms"] == pytest.approx(gemm_us / 4 / 1e3) and "upper bound" in a["saving_note"]
    # Not where TF32 was allowed, on a GPU without TF32 (a V100), or where float32 GEMMs are little.
    for run, share, cc in ((ATTENTION_RUN, 0.5, "9.0"), (OFF_MULTIPLE_RUN, 0.5, "7.0"), (OFF_MULTIPLE_RUN, 0.05, "9.0")):
        data, text, html = reports(as_gpu_run(more, tmp_path, run, gemm_share=share, cc=cc), run)
        assert_not_shown("tf32_matmuls", data, text, html)


def test_gemm_dimensions_off_the_tensor_core_multiple_are_told_to_pad(more, tmp_path):
    db = as_gpu_run(more, tmp_path, OFF_MULTIPLE_RUN, gemm_share=0.5, gemm_dtype="bfloat16")
    data, text, html = reports(db, OFF_MULTIPLE_RUN)
    a = assert_shown("gemm_tensor_core_dims", data, text, html)
    assert "Pad" in a["action"] and "50%" in a["title"] and a["saving_ms"] is None
    # Every GEMM has 30 or 60 in it, neither a multiple of 8.
    assert re.search(r"\[M=\d+,N=\d+,K=\d+\] bfloat16 (addmm|mm) \(([MNK], )*[MNK] not a multiple of 8", a["evidence"])
    assert_not_shown("tf32_matmuls", data, text, html)
    # float32 GEMMs without TF32 run on no tensor core (the TF32 rule's case); with TF32 allowed
    # and on the multiples of 4 nothing is to pad.
    for run in (OFF_MULTIPLE_RUN, ATTENTION_RUN):
        data, text, html = reports(as_gpu_run(more, tmp_path, run, gemm_share=0.5), run)
        assert_not_shown("gemm_tensor_core_dims", data, text, html)


def test_synchronize_and_copies_to_the_host_are_syncs_to_remove(more, tmp_path):
    # The start-up hook's scope records torch.cuda.synchronize() (it raised here: no GPU).
    with sqlite3.connect(more) as con:
        assert con.execute("SELECT sum(calls) FROM op_stats WHERE run_id = ? AND name = 'torch.cuda.synchronize'",
                           (OFF_MULTIPLE_RUN,)).fetchone()[0] == 4
    # A .cpu() a step (as the collector records it on a GPU), and a non_blocking copy that does not wait.
    copies = ["INSERT INTO shape_stats(run_id, rank, op, shape, normalized_shape, dtype, affine, phase, calls,"
              f" cpu_total_us, cuda_total_us, flags) VALUES ({OFF_MULTIPLE_RUN}, 0, 'copy_to_host', '[16,8]', '', 'float32', 0,"
              f" 'fwd', {calls}, 400, 1, 'non_blocking={nb}')" for calls, nb in ((4, 0), (8, 1))]
    data, text, html = reports(as_gpu_run(more, tmp_path, OFF_MULTIPLE_RUN, more_statements=copies), OFF_MULTIPLE_RUN)
    a = assert_shown("host_device_sync", data, text, html)
    assert "torch.cuda.synchronize() 1.0 a step" in a["evidence"]
    assert "aten::copy_ from the GPU to the host 1.0 a step (.cpu()" in a["evidence"] and "waits for the GPU 2.0" in a["title"]
    assert "torch.cuda.synchronize()" in a["action"]


def _attention_gpu_run(more, tmp_path, attention_share, gpu="NVIDIA H200", kernel="flash_fwd_kernel"):
    """The attention run on a GPU, its SDPA kernels `attention_share` of the ops' GPU time."""
    kernels = [f"INSERT INTO kernel_stats(run_id, rank, name, calls, cuda_us) SELECT {ATTENTION_RUN}, 0, '{kernel}', 4,"
               f" {attention_share} * 10.0 * count(*) FROM op_stats WHERE run_id = {ATTENTION_RUN}"]
    return as_gpu_run(more, tmp_path, ATTENTION_RUN, gpu=gpu, more_statements=kernels)


def fake_tune(db, good_us=50, **winners):
    """hfnn tune on the attention run with the stand-in worker: each pass's winner named by
    `winners` (fwd, bwd, train) at `good_us` µs a call against torch's 100."""
    env = dict(os.environ, HFNN_TUNE_WORKER=str(FAKE_WORKER), FAKE_TUNE_GOOD_US=str(good_us),
               **{f"FAKE_TUNE_WINNER_{p.upper()}": w for p, w in winners.items()})
    out = subprocess.run([HFNN, "tune", "--db", str(db), "--run", str(ATTENTION_RUN), "-q", "--python", sys.executable],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr


def test_attention_in_one_sdpa_core_is_told_to_let_hfnn_tune_time_the_others(more, tmp_path):
    db = _attention_gpu_run(more, tmp_path, 0.4)
    data, text, html = reports(db, ATTENTION_RUN)
    a = assert_shown("sdpa_backend", data, text, html)
    assert "40%" in a["title"] and "flash core" in a["title"] and "flash" in a["evidence"]
    assert f"hfnn tune --db {db}" in a["action"] and "MultiheadAttention" in a["evidence"] and a["saving_ms"] is None
    # Tuned on this GPU: a faster core is named, with hfnn tune's projection for the attention keys.
    db = _attention_gpu_run(more, tmp_path, 0.4, gpu="Fake GPU")
    fake_tune(db, train="sdpa_cudnn")
    data, text, html = reports(db, ATTENTION_RUN)
    a = assert_shown("sdpa_backend", data, text, html)
    assert "sdpa_cudnn" in a["evidence"] and f"HFNN_DISPATCH_DB={db}" in a["action"] and a["saving_ms"] > 0
    # The core in use won: nothing to change. Little attention: nothing to say.
    db = _attention_gpu_run(more, tmp_path, 0.4, gpu="Fake GPU")
    fake_tune(db, train="sdpa_flash")
    assert_not_shown("sdpa_backend", *reports(db, ATTENTION_RUN))
    assert_not_shown("sdpa_backend", *reports(_attention_gpu_run(more, tmp_path, 0.02), ATTENTION_RUN))


def test_keys_hfnn_tune_would_time_are_named_then_its_projection_given(more, tmp_path):
    db = _attention_gpu_run(more, tmp_path, 0.02, gpu="Fake GPU")
    data, text, html = reports(db, ATTENTION_RUN)
    a = assert_shown("hfnn_tune", data, text, html)
    assert "LayerNorm" in a["evidence"] and "MultiheadAttention" in a["evidence"] and f"hfnn tune --db {db}" in a["action"]
    # Two keys, each 5% of the GPU's 2 ms busy time a step (hfnn tune's step without a plain one):
    # their whole time is the upper bound.
    assert "10% of the step" in a["title"] and "(of the GPU busy time of a step)" in a["evidence"]
    assert a["saving_ms"] == pytest.approx(2 * 0.05 * 2) and "upper bound" in a["saving_note"]
    fake_tune(db, fwd="good", bwd="good", train="sdpa_cudnn")
    data, text, html = reports(db, ATTENTION_RUN)
    a = assert_shown("hfnn_tune", data, text, html)
    projection = data["tune"]["envs"][0]["projection"]
    # LayerNorm's forward and backward, and attention, once a step each: 3 x 50 µs saved of 2 ms.
    assert a["saving_ms"] == pytest.approx(projection["saved_ms"]) == pytest.approx(0.15)
    assert f"{2 / 1.85:.3f}x faster" in a["title"]
    assert "Projected step time" in a["evidence"] and f"HFNN_DISPATCH_DB={db}" in a["action"]
    # Tuned, and torch won every key, or the winners save under 1% of the step (3 x 4 µs of 2 ms):
    # nothing worth a line. No key at all: nothing to tune.
    for good_us in (150, 96):
        db = _attention_gpu_run(more, tmp_path, 0.02, gpu="Fake GPU")
        fake_tune(db, good_us=good_us)
        data, text, html = reports(db, ATTENTION_RUN)
        assert_not_shown("hfnn_tune", data, text, html)
        assert data["tune"]["envs"][0]["projection"]["saved_ms"] == pytest.approx(0 if good_us > 100 else 0.012)
    assert_not_shown("hfnn_tune", *reports(as_gpu_run(more, tmp_path, OFF_MULTIPLE_RUN, gemm_share=0.5),
                                           OFF_MULTIPLE_RUN))


GPU_TRAIN = """
import sys
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(30, 60), torch.nn.ReLU(), torch.nn.Linear(60, 8)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(int(sys.argv[1])):
    loss = model(torch.randn(16, 30, device="cuda")).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    logged = loss.detach().cpu()  # a copy to the host: it waits for the GPU
    torch.cuda.synchronize()
"""


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device: the GPU side of the sync and GEMM records runs on the GPU machine")
def test_a_gpu_run_records_its_copies_to_the_host_and_its_gemms(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(GPU_TRAIN)
    db = tmp_path / "shapes.db"
    out = subprocess.run([HFNN, "profile", "-q", "--db", str(db), "--python", sys.executable, "--warmup", "2",
                          "--steps", "4", str(script), "8"], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    with sqlite3.connect(db) as con:
        copies = con.execute("SELECT shape, dtype, flags, sum(calls), sum(cuda_total_us) FROM shape_stats WHERE op ="
                             " 'copy_to_host' GROUP BY shape, dtype, flags").fetchall()
        gemms = con.execute("SELECT flags, sum(cuda_total_us) FROM shape_stats WHERE op = 'gemm' AND shape ="
                            " '[16,60,30]' GROUP BY flags").fetchall()
    assert len(copies) == 1 and copies[0][:4] == ("[]", "float32", "non_blocking=0", 4) and copies[0][4] > 0
    assert gemms[0][0] == "op=addmm,tf32=0" and gemms[0][1] > 0  # TF32 is off by default
    data, text, html = reports(db, 1)
    a = assert_shown("host_device_sync", data, text, html)
    assert "aten::copy_ from the GPU to the host 1.0 a step" in a["evidence"]
    assert "torch.cuda.synchronize() 1.0 a step" in a["evidence"]
