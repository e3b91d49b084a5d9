"""The plain step (issue 13, item 1): `hfnn profile --plain-steps N` times N steps after the recorded
ones with every collection off, stores their median per process, and every report states what the
profiler cost the run against it, or why it cannot; and `--sample N` (item 2), which records every
N-th step in full and only times the others. Real CPU training runs; CPU step times are noisy, so
the tests check what was measured and where it goes, not how fast it was."""
import json
import shutil
import sqlite3
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

HFNN = shutil.which("hfnn")
SCRIPT = Path(__file__).parent / "scripts" / "tiny_train.py"
pytestmark = pytest.mark.skipif(HFNN is None, reason="the hfnn executable is not on PATH: run scripts/setup.sh")


def profile(tmp_path, *args, db="shapes.db"):
    cmd = [HFNN, "profile", "--db", str(tmp_path / db), "--python", sys.executable, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=tmp_path)


def rows(db, sql, *params):
    with sqlite3.connect(db) as con:
        return con.execute(sql, params).fetchall()


def report(db, fmt, *args):
    out = subprocess.run([HFNN, "report", "--db", str(db), "--format", fmt, *args], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("mode", ["optimizer", "manual-steps"])
def test_plain_steps_are_timed_after_the_recorded_ones_and_every_report_states_the_cost(tmp_path, mode):
    # 1 warm-up + 3 recorded + 1 left out (the profiler's tear-down) + 5 plain = 10 of the script's 12.
    out = profile(tmp_path, "--warmup", "1", "--steps", "3", "--plain-steps", "5", str(SCRIPT), "12",
                  *([mode] if mode != "optimizer" else []))
    assert out.returncode == 0, out.stderr
    db = tmp_path / "shapes.db"
    assert rows(db, "SELECT plain_steps_requested, steps_recorded FROM runs") == [(5, 3)]
    ((plain_steps, plain_ms, boundaries),) = rows(db, "SELECT plain_steps, plain_step_ms, step_boundaries FROM ranks")
    assert plain_steps == 5 and plain_ms > 0
    assert boundaries == 10  # after the plain steps nothing is observed, not even the steps
    # The plain steps are not in the profile: LayerNorm ran twice a step, in the 3 recorded steps only.
    assert rows(db, "SELECT sum(calls) FROM shape_stats WHERE op = 'layer_norm' AND phase = 'fwd'") == [(6,)]
    assert len(rows(db, "SELECT * FROM step_stats")) == 3
    assert rows(db, "SELECT count(*) FROM op_stats WHERE name LIKE 'hfnn::profiler_%'") == [(0,)]  # hfnn's own

    profiled = statistics.median(w for (w,) in rows(db, "SELECT wall_ms FROM step_stats"))
    data = json.loads(report(db, "json"))
    cost = data["profiler_cost"]
    assert cost["plain_step_ms"] == pytest.approx(plain_ms) and cost["plain_steps"] == 5
    assert cost["profiled_step_ms"] == pytest.approx(profiled) and cost["basis"] == "plain"
    assert cost["cost_pct"] == pytest.approx(100 * (profiled / plain_ms - 1))
    assert cost["plain_steps_requested"] == 5 and cost["note"] == ""
    assert cost["text"].startswith("The profiler cost this run ")
    (rank,) = data["steps"]
    assert rank["plain_step_ms"] == pytest.approx(plain_ms) and rank["plain_steps"] == 5
    # The sentence is the same in the text report, the one hfnn profile prints, and the HTML page.
    assert cost["text"] in out.stdout and cost["text"] in report(db, "text")
    assert f"plain step {plain_ms:.2f} ms (5 steps)" in out.stdout
    html = report(db, "html")
    assert '<div class="note" id="profiler-cost">The profiler cost this run ' in html and "plain step ms" in html
    steps_row = next(r for r in report(db, "csv").splitlines() if r.startswith("steps,"))
    assert steps_row.endswith(f",{json.dumps(plain_ms)},5")


def test_a_script_that_ends_before_the_plain_steps_says_how_many_steps_to_run(tmp_path):
    # 1 + 3 recorded, then the script ends: the profile is whole, the reports say why there is no
    # plain step and how many steps would give one, and the exit status is the script's.
    out = profile(tmp_path, "--warmup", "1", "--steps", "3", "--plain-steps", "5", str(SCRIPT), "5")
    assert out.returncode == 0, out.stderr
    db = tmp_path / "shapes.db"
    assert rows(db, "SELECT plain_steps, plain_step_ms FROM ranks") == [(0, None)]
    assert len(rows(db, "SELECT * FROM step_stats")) == 3 and rows(db, "SELECT exit_code FROM runs") == [(0,)]
    why = ("no plain step (the script ended first: it ran 5 steps, and timing 5 plain steps needs 10 (--warmup 1 + "
           "--steps 3 + 1 for the profiler's tear-down + --plain-steps 5); run that many, or lower --steps)")
    assert why in out.stdout and "take the step under the profiler" in out.stdout
    cost = json.loads(report(db, "json"))["profiler_cost"]
    assert cost["plain_step_ms"] is None and cost["cost_pct"] is None and cost["basis"] == "profiled"
    assert why in report(db, "html")

    # Fewer plain steps than asked: the plain step from those, saying so; under 3, too few for a median.
    out = profile(tmp_path, "--warmup", "1", "--steps", "3", "--plain-steps", "5", str(SCRIPT), "8", db="short.db")
    assert out.returncode == 0, out.stderr
    assert rows(tmp_path / "short.db", "SELECT plain_steps FROM ranks") == [(3,)]
    assert ("(the plain step: 3 steps timed after the recorded ones with collection off; 3 of the 5 plain steps "
            "asked: the script ended first (it needs 10 steps to time them all") in out.stdout
    # Had it timed 2, too few for a median: stored, not taken.
    with sqlite3.connect(tmp_path / "short.db") as con:
        con.execute("UPDATE ranks SET plain_steps = 2, step_boundaries = 7")
    assert ("no plain step (the script ended first: it ran 7 steps, 2 of them plain (a median takes 3), and"
            in report(tmp_path / "short.db", "text"))
    assert json.loads(report(tmp_path / "short.db", "json"))["profiler_cost"]["plain_step_ms"] is None


def test_no_plain_step_asked_for_says_so(tmp_path):
    # --steps 0 records to the end: no plain step, though the script runs 10 steps past the default's need.
    out = profile(tmp_path, "--warmup", "1", "--steps", "0", str(SCRIPT), "25")
    assert out.returncode == 0, out.stderr
    assert "--steps 0 records every step to the end, so none ran without the profiler" in out.stdout
    assert rows(tmp_path / "shapes.db", "SELECT plain_steps, steps_recorded FROM ranks") == [(0, 24)]
    with sqlite3.connect(tmp_path / "shapes.db") as con:  # as --plain-steps 0 stores it
        con.execute("UPDATE runs SET steps_requested = 24, plain_steps_requested = 0")
    assert "no plain step (--plain-steps 0)" in report(tmp_path / "shapes.db", "text")


MHA_SCRIPT = r"""
import json, sys, torch, hfnn
from torch import nn
torch.manual_seed(0)
attention = nn.MultiheadAttention(16, 2, batch_first=True)
opt = torch.optim.SGD(attention.parameters(), lr=0.01)
labelled = []  # per step: is hfnn profile's MultiheadAttention label still on?
for _ in range(8):
    labelled.append(hasattr(nn.MultiheadAttention.forward, "__wrapped__") or hfnn.nn._lstm_profiled)
    x = torch.randn(2, 4, 16)
    attention(x, x, x, need_weights=False)[0].sum().backward()
    opt.step()
    opt.zero_grad()
json.dump(labelled, open(sys.argv[1], "w"))
"""


def test_the_python_side_labels_come_off_before_the_plain_steps(tmp_path):
    # Steps 1-3 recorded (1 warm-up), step 4 left out: its optimizer step is the first to see the
    # recording over, so steps 5-7 (plain) and 8 run without the MultiheadAttention and LSTM labels.
    (tmp_path / "mha.py").write_text(MHA_SCRIPT)
    out = profile(tmp_path, "--warmup", "1", "--steps", "2", "--plain-steps", "3", "mha.py", str(tmp_path / "l.json"))
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "l.json").read_text()) == [True] * 4 + [False] * 4
    assert rows(tmp_path / "shapes.db", "SELECT plain_steps FROM ranks") == [(3,)]
    assert rows(tmp_path / "shapes.db", "SELECT calls FROM shape_stats WHERE op = 'multihead_attention'") == [(2,)]


def test_an_older_run_without_a_plain_step_reads_and_tunes_as_before(tmp_path):
    # A schema-4 file (before the plain step): hfnn tune reads it read-only, unchanged; hfnn report
    # migrates it and says its run was not timed without the profiler.
    out = profile(tmp_path, "-q", "--warmup", "1", "--steps", "2", str(SCRIPT), "4")
    assert out.returncode == 0, out.stderr
    db = tmp_path / "shapes.db"
    with sqlite3.connect(db) as con:
        for table, column in (("runs", "plain_steps_requested"), ("ranks", "plain_steps"), ("ranks", "plain_step_ms"),
                              ("runs", "sample_every"), ("ranks", "unsampled_steps"), ("ranks", "unsampled_step_ms")):
            con.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        con.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
    before = db.read_bytes()
    dry = subprocess.run([HFNN, "tune", "--db", str(db), "--dry-run"], capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0 and "Would tune 2 key(s)" in dry.stdout, dry.stderr
    assert db.read_bytes() == before
    text = report(db, "text")
    assert "no plain step (this run was recorded by an hfnn that did not time steps without the profiler)" in text
    assert rows(db, "SELECT value FROM meta WHERE key = 'schema_version'") == [("6",)]


@pytest.mark.skipif(not __import__("torch").cuda.is_available(),
                    reason="no CUDA device: CUPTI's tear-down before the plain steps runs on the GPU machine")
def test_on_a_gpu_the_last_recorded_step_keeps_its_kernels_and_the_plain_steps_have_none(tmp_path):
    # CUPTI is stopped at the end of the recorded steps, after the device drained: every recorded
    # step, the last one too, has its GPU busy time, and no kernel of the plain steps is counted.
    out = profile(tmp_path, "--warmup", "2", "--steps", "4", "--plain-steps", "6", str(SCRIPT), "16", "cuda")
    assert out.returncode == 0, out.stderr
    db = tmp_path / "shapes.db"
    steps = rows(db, "SELECT step, wall_ms, gpu_busy_ms FROM step_stats ORDER BY step")
    assert len(steps) == 4 and all(b is not None and 0 < b <= w for _, w, b in steps), steps
    ((plain_steps, plain_ms),) = rows(db, "SELECT plain_steps, plain_step_ms FROM ranks")
    assert plain_steps == 6 and plain_ms > 0
    # The same 4 recorded steps without plain steps after them: as many kernels, so none of the plain
    # steps' was counted.
    again = profile(tmp_path, "--warmup", "2", "--steps", "4", "--plain-steps", "0", str(SCRIPT), "6", "cuda",
                    db="alone.db")
    assert again.returncode == 0, again.stderr
    kernels = [rows(d, "SELECT sum(calls) FROM kernel_stats") for d in (db, tmp_path / "alone.db")]
    assert kernels[0] == kernels[1] and kernels[0][0][0] > 0
    data = json.loads(report(db, "json"))
    assert data["profiler_cost"]["basis"] == "plain" and data["steps"][0]["gpu_busy_share_of"] == "plain"
    assert data["steps"][0]["gpu_busy_share"] == pytest.approx(data["steps"][0]["gpu_busy_ms"] / plain_ms)


@pytest.mark.parametrize("mode", ["optimizer", "manual-steps"])
@pytest.mark.parametrize("window", [9, 7])
def test_sample_records_every_nth_step_in_full_and_times_the_ones_between(tmp_path, mode, window):
    # 1 warm-up; a window of 9 steps, of which 1, 4 and 7 are recorded in full and 6 timed between
    # them, or of 7 (the last recorded: 4 between); 1 left out; 3 plain.
    between = window - 3
    script_steps = 1 + window + 1 + 3
    out = profile(tmp_path, "--warmup", "1", "--steps", str(window), "--sample", "3", "--plain-steps", "3",
                  str(SCRIPT), str(script_steps), *([mode] if mode != "optimizer" else []))
    assert out.returncode == 0, out.stderr
    db = tmp_path / "shapes.db"
    assert rows(db, "SELECT sample_every, steps_requested, steps_recorded FROM runs") == [(3, window, 3)]
    ((steps, unsampled, unsampled_ms, plain, boundaries),) = rows(
        db, "SELECT steps_recorded, unsampled_steps, unsampled_step_ms, plain_steps, step_boundaries FROM ranks")
    assert (steps, unsampled, plain, boundaries) == (3, between, 3, script_steps) and unsampled_ms > 0
    assert len(rows(db, "SELECT * FROM step_stats")) == 3
    # Only the recorded steps are in the profile: two LayerNorms and two Linears a step.
    assert rows(db, "SELECT op, sum(calls) FROM shape_stats WHERE phase = 'fwd' GROUP BY op ORDER BY op") == [
        ("gemm", 6), ("layer_norm", 6)]
    assert rows(db, "SELECT calls FROM op_stats WHERE name = 'aten::addmm'") == [(6,)]
    assert rows(db, "SELECT count(*) FROM op_stats WHERE name LIKE 'hfnn::profiler_%'") == [(0,)]
    cost = json.loads(report(db, "json"))["profiler_cost"]
    assert (cost["sample_every"], cost["unsampled_steps"], cost["plain_from"]) == (3, between, "after")
    assert cost["unsampled_step_ms"] == pytest.approx(unsampled_ms)
    assert (f"Under --sample 3 one step in 3 was recorded in full (3 steps); the figures are theirs, and the "
            f"{between} steps timed between them took {unsampled_ms:.2f} ms (median)") in cost["text"]
    assert cost["text"] in out.stdout and cost["text"] in report(db, "text")


def test_sample_one_is_a_full_recording(tmp_path):
    # The default: every step of the window recorded, nothing timed between them.
    out = profile(tmp_path, "--warmup", "1", "--steps", "3", "--sample", "1", "--plain-steps", "3", str(SCRIPT), "8")
    assert out.returncode == 0, out.stderr
    db = tmp_path / "shapes.db"
    assert rows(db, "SELECT sample_every, steps_recorded FROM runs") == [(1, 3)]
    assert rows(db, "SELECT unsampled_steps, unsampled_step_ms, plain_steps FROM ranks") == [(0, None, 3)]
    cost = json.loads(report(db, "json"))["profiler_cost"]
    assert cost["sample_every"] == 1 and cost["unsampled_step_ms"] is None and "--sample" not in cost["text"]


def test_sample_without_steps_after_takes_the_steps_between_as_the_plain_step(tmp_path):
    # A profiler left on: --steps 0 records to the end, so no plain step is timed after the recorded
    # ones; under --sample the steps between them ran with collection off and stand in for it.
    out = profile(tmp_path, "--warmup", "1", "--steps", "0", "--sample", "4", str(SCRIPT), "17")
    assert out.returncode == 0, out.stderr
    db = tmp_path / "shapes.db"
    # 16 steps after the warm-up: 4 recorded (1, 5, 9, 13), 12 timed between them.
    assert rows(db, "SELECT steps_recorded, unsampled_steps, plain_steps FROM ranks") == [(4, 12, 0)]
    assert rows(db, "SELECT calls FROM op_stats WHERE name = 'aten::addmm'") == [(8,)]
    cost = json.loads(report(db, "json"))["profiler_cost"]
    assert (cost["basis"], cost["plain_from"], cost["plain_steps"]) == ("plain", "between", 12)
    assert cost["plain_step_ms"] == pytest.approx(cost["unsampled_step_ms"]) and cost["cost_pct"] is not None
    assert "the plain step: 12 steps between the recorded ones under --sample 4" in cost["text"]
    # It is the rank's plain step too (the GPU's busy share is of it).
    (rank,) = json.loads(report(db, "json"))["steps"]
    assert rank["plain_step_ms"] == pytest.approx(cost["plain_step_ms"]) and rank["plain_steps"] == 12


@pytest.mark.skipif(not __import__("torch").cuda.is_available(),
                    reason="no CUDA device: --sample's pause and resume of CUPTI around the steps between run on the "
                           "GPU machine")
def test_on_a_gpu_sample_keeps_the_recorded_steps_kernels_and_none_of_the_ones_between(tmp_path):
    # Script steps 3, 6 and 9 recorded (2 warm-up), 4-5 and 7-8 and 10-11 between them with CUPTI
    # paused: each recorded step has its GPU busy time, and the kernels are those of 3 steps.
    out = profile(tmp_path, "--warmup", "2", "--steps", "9", "--sample", "3", "--plain-steps", "3", str(SCRIPT), "15",
                  "cuda")
    assert out.returncode == 0, out.stderr
    db = tmp_path / "shapes.db"
    steps = rows(db, "SELECT step, wall_ms, gpu_busy_ms FROM step_stats ORDER BY step")
    assert len(steps) == 3 and all(b is not None and 0 < b <= w for _, w, b in steps), steps
    assert rows(db, "SELECT unsampled_steps, plain_steps FROM ranks") == [(6, 3)]
    full = profile(tmp_path, "--warmup", "2", "--steps", "3", "--plain-steps", "0", str(SCRIPT), "5", "cuda",
                   db="full.db")
    assert full.returncode == 0, full.stderr
    kernels = [rows(d, "SELECT name, sum(calls) FROM kernel_stats GROUP BY name ORDER BY name")
               for d in (db, tmp_path / "full.db")]
    assert kernels[0] == kernels[1] and kernels[0], kernels
    cuda = [rows(d, "SELECT sum(calls) FROM op_stats WHERE cuda_self_us > 0") for d in (db, tmp_path / "full.db")]
    assert cuda[0] == cuda[1], cuda


GPU_BOUND_SCRIPT = r"""
import json, sys, time, torch, hfnn
steps, out, device = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
x = torch.randn(4096, 4096, device=f"cuda:{device}") / 64  # no torch.cuda.set_device: device 0 stays current


def step():
    y = x
    for _ in range(4):  # milliseconds of GPU a step, launched in microseconds: the host runs steps ahead
        y = y @ x
    hfnn.step()


for _ in range(steps):
    step()
torch.cuda.synchronize(device)
t0 = time.perf_counter()
for _ in range(10):  # the step as the GPU runs it, timed by the script itself
    step()
torch.cuda.synchronize(device)
json.dump({"step_ms": (time.perf_counter() - t0) * 100}, open(out, "w"))
"""


def _gpu_device(index):
    torch = __import__("torch")
    if not torch.cuda.is_available():
        return pytest.mark.skip(reason="no CUDA device: GPU-bound steps run on the GPU machine")
    if torch.cuda.device_count() <= index:
        return pytest.mark.skip(reason=f"fewer than {index + 1} CUDA devices: kernels on another device than the "
                                       "current one need two")
    return ()


@pytest.mark.parametrize("device", [pytest.param(0, marks=_gpu_device(0)), pytest.param(1, marks=_gpu_device(1))])
def test_on_a_gpu_steps_that_never_wait_for_it_are_timed_as_the_gpu_runs_them(tmp_path, device):
    # The loop never synchronises: on the host a step is its launches, microseconds, and the host
    # runs ahead until the launch queue is full. Each step's time is the longer of its host and GPU
    # intervals (CUDA events on the current stream of the device its kernels ran on), so the
    # recorded, plain and unsampled steps all come out as the step the script times with a sync
    # around ten of them. On cuda:1 with device 0 current (torchrun without set_device), the
    # drain at the end of the recorded steps waits for cuda:1: the last step keeps its kernels.
    (tmp_path / "bound.py").write_text(GPU_BOUND_SCRIPT)
    # 2 warm-up + 4 recorded + 1 left out + 6 plain = 13.
    out = profile(tmp_path, "--warmup", "2", "--steps", "4", "--plain-steps", "6", "bound.py", "13",
                  str(tmp_path / "t.json"), str(device))
    assert out.returncode == 0, out.stderr
    true_ms = json.loads((tmp_path / "t.json").read_text())["step_ms"]
    db = tmp_path / "shapes.db"
    ((plain_ms,),) = rows(db, "SELECT plain_step_ms FROM ranks")
    assert 0.7 * true_ms < plain_ms < 1.5 * true_ms, (plain_ms, true_ms)
    steps = rows(db, "SELECT step, wall_ms, gpu_busy_ms FROM step_stats ORDER BY step")
    assert len(steps) == 4 and all(0.7 * true_ms < w < 1.5 * true_ms for _, w, _ in steps), (steps, true_ms)
    assert all(b is not None and 0.5 * true_ms < b <= 1.01 * w for _, w, b in steps), (steps, true_ms)
    cost = json.loads(report(db, "json"))["profiler_cost"]
    assert cost["basis"] == "plain" and abs(cost["cost_pct"]) < 30, cost
    # --sample with --steps 0: the steps between the recorded ones, likewise.
    out = profile(tmp_path, "--warmup", "2", "--steps", "0", "--sample", "3", "bound.py", "20",
                  str(tmp_path / "t.json"), str(device), db="sample.db")
    assert out.returncode == 0, out.stderr
    true_ms = json.loads((tmp_path / "t.json").read_text())["step_ms"]
    ((unsampled, unsampled_ms),) = rows(tmp_path / "sample.db", "SELECT unsampled_steps, unsampled_step_ms FROM ranks")
    assert unsampled >= 10 and 0.7 * true_ms < unsampled_ms < 1.5 * true_ms, (unsampled_ms, true_ms)


def test_sample_keeps_the_python_side_labels_on_between_the_recorded_steps(tmp_path):
    # The window's steps all run with the labels (the MultiheadAttention shapes of the recorded
    # ones need them); they come off after it, as without --sample.
    (tmp_path / "mha.py").write_text(MHA_SCRIPT)
    out = profile(tmp_path, "--warmup", "1", "--steps", "4", "--sample", "2", "--plain-steps", "2", "mha.py",
                  str(tmp_path / "l.json"))
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "l.json").read_text()) == [True] * 6 + [False] * 2
    assert rows(tmp_path / "shapes.db", "SELECT calls FROM shape_stats WHERE op = 'multihead_attention'") == [(2,)]


def test_sample_below_one_is_refused_in_one_line(tmp_path):
    out = profile(tmp_path, "--sample", "0", str(SCRIPT), "3")
    assert out.returncode == 2 and "--sample" in out.stderr and out.stderr.strip().count("\n") == 0, out.stderr
    assert not (tmp_path / "shapes.db").exists()
