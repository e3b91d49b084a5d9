"""The reports' Advice section (profiles/advice.h): each rule on a run that triggers it and on one
that does not, checked in the JSON fields, the text and the HTML section. Two real CPU training
runs (AdamW as a for-loop, and with foreach=True); the GPU rules on copies of the foreach run's
database given the CUDA numbers a GPU run would have (no GPU here)."""
import json
import re
import shutil
import sqlite3
import subprocess
import sys

import pytest

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
