"""`hfnn tune` on the CPU path: a real profile of a training script, then the tune command driven by
a stand-in worker (tests/python/scripts/fake_tune_worker.py: the real worker's protocol with
made-up timings), so the keys, the gate, the choice, the stored results, skipping, --force, Ctrl-C,
the dry run, a machine without a GPU and bad databases are all checked here. The real worker,
measuring real kernels, runs in test_tune_on_the_gpu on the GPU machine."""
import hashlib
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import requires_gpu

HFNN = shutil.which("hfnn")
SCRIPTS = Path(__file__).parent / "scripts"
FAKE_WORKER = SCRIPTS / "fake_tune_worker.py"
pytestmark = pytest.mark.skipif(HFNN is None, reason="the hfnn executable is not on PATH: run scripts/setup.sh")


def rows(db, sql, *params):
    with sqlite3.connect(db) as con:
        return con.execute(sql, params).fetchall()


def digest(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """A profile of tiny_train.py: LayerNorm [16,64] with and without affine, forward and backward."""
    d = tmp_path_factory.mktemp("tune")
    out = subprocess.run([HFNN, "profile", "-q", "--db", str(d / "shapes.db"), "--python", sys.executable,
                          str(SCRIPTS / "tiny_train.py"), "6"], capture_output=True, text=True, timeout=120, cwd=d)
    assert out.returncode == 0, out.stderr
    # Steps of 10 ms, whatever this host's speed: the stand-in's times (torch 100 µs, the winner 50)
    # then stay a known part of the step, below the whole of it.
    with sqlite3.connect(d / "shapes.db") as con:
        con.execute("UPDATE step_stats SET wall_ms = 10 + 0.01 * step")
    return d / "shapes.db"


@pytest.fixture
def db(profiled, tmp_path):
    copy = tmp_path / "shapes.db"
    shutil.copy(profiled, copy)
    return copy


def tune(db, *args, fake=True, env=None, **kw):
    e = dict(os.environ, **(env or {}))
    if fake:
        e["HFNN_TUNE_WORKER"] = str(FAKE_WORKER)
    return subprocess.run([HFNN, "tune", "--db", str(db), "--python", sys.executable, *args], capture_output=True,
                          text=True, timeout=120, env=e, **kw)


def test_dry_run_lists_the_keys_and_leaves_the_database_alone(db):
    before = digest(db)
    out = tune(db, "--dry-run", fake=False)
    assert out.returncode == 0, out.stderr
    assert "16 x 64 no-affine" in out.stdout and "16 x 64 " in out.stdout and "Would tune 2 key(s)" in out.stdout
    assert "fwd+bwd" in out.stdout and "[16,64]" in out.stdout
    assert digest(db) == before


def test_without_a_gpu_it_says_so_in_one_line_and_changes_nothing(db):
    before = digest(db)
    out = tune(db, env={"FAKE_TUNE_NO_GPU": "1"})
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1 and "no CUDA device" in out.stderr and "is unchanged" in out.stderr
    assert digest(db) == before


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU: the real worker tunes")
def test_the_real_worker_without_a_gpu(db):
    before = digest(db)
    out = tune(db, fake=False)
    assert out.returncode == 1 and "no CUDA device" in out.stderr and "Traceback" not in out.stderr
    assert digest(db) == before


def test_bad_databases_are_refused_untouched(tmp_path):
    missing = tune(tmp_path / "nope.db")
    assert missing.returncode == 2 and "no such database" in missing.stderr and not (tmp_path / "nope.db").exists()
    text = tmp_path / "notes.db"
    text.write_text("not a database\n")
    out = tune(text)
    assert out.returncode == 2 and "not an hfnn database" in out.stderr and text.read_text() == "not a database\n"
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as con:
        con.execute("CREATE TABLE t(x)")
    before = digest(other)
    assert tune(other).returncode == 2 and digest(other) == before
    bad_run = tune(tmp_path / "nope.db", "--ops", "gru")
    assert bad_run.returncode == 2 and "no kernel variants for gru" in bad_run.stderr
    assert "(tunable: layer_norm, multihead_attention, lstm)" in bad_run.stderr


def test_ops_names_the_families_to_tune(db):
    """--ops takes the op names the profile records and tunes only their keys."""
    out = tune(db, "--dry-run", "--ops", "layer_norm", fake=False)
    assert out.returncode == 0, out.stderr
    assert "2 LayerNorm key(s)" in out.stdout and "LayerNorm 16 x 64 (rows x D)" in out.stdout
    assert "Would tune 2 key(s)" in out.stdout


def test_winners_results_and_the_planted_wrong_variant(db):
    out = tune(db)
    assert out.returncode == 0, out.stderr
    # Both keys, both passes: the 50 µs variant wins; the 10 µs wrong one is rejected with its error.
    winners = rows(db, "SELECT key, pass, winner, torch_us, best_us FROM tune_winners ORDER BY key, pass")
    assert winners == [("rows=16,D=64,affine=0", "bwd", "good", 100.0, 50.0), ("rows=16,D=64,affine=0", "fwd", "good", 100.0, 50.0),
                       ("rows=16,D=64,affine=1", "bwd", "good", 100.0, 50.0), ("rows=16,D=64,affine=1", "fwd", "good", 100.0, 50.0)]
    planted = rows(db, "SELECT accepted, max_error, reason FROM tune_results WHERE candidate = 'planted_wrong'")
    assert len(planted) == 4 and all(a == 0 and e == 0.3 and "over the allowed" in r for a, e, r in planted)
    broken = rows(db, "SELECT accepted, median_us, reason FROM tune_results WHERE candidate = 'broken'")
    assert broken and all(r == (0, None, "invalid configuration argument") for r in broken)
    assert rows(db, "SELECT DISTINCT accepted FROM tune_results WHERE candidate IN ('good', 'meh', 'torch')") == [(1,)]
    ((gpu, cc, sms),) = rows(db, "SELECT gpu, compute_capability, sm_count FROM tune_envs")
    assert (gpu, cc, sms) == ("Fake GPU", "9.0", 132)
    assert "Projected step time" in out.stdout and "2.00x" in out.stdout and "2 rejected" in out.stdout
    # hfnn report shows the same table, in every format.
    report = subprocess.run([HFNN, "report", "--db", str(db), "--format", "json"], capture_output=True, text=True)
    tuned = json.loads(report.stdout)["tune"]["envs"]
    assert len(tuned) == 1 and len(tuned[0]["rows"]) == 4 and tuned[0]["projection"]["speedup"] > 1
    # Every winner halves torch's time, so torch's time in the keys is twice the saving; the
    # ceiling (those keys at zero cost) is above the projection.
    p = tuned[0]["projection"]
    assert abs(p["torch_ms"] - 2 * p["saved_ms"]) < 1e-9 and p["ceiling"] > p["speedup"]
    assert "Ceiling: torch spends" in out.stdout
    assert p["basis"] == "wall" and p["step_ms"] == p["wall_step_ms"]  # a CPU profile: no GPU busy time
    text = subprocess.run([HFNN, "report", "--db", str(db)], capture_output=True, text=True).stdout
    assert "Tuned on Fake GPU" in text and "Projected step time" in text
    csv_rows = [l for l in subprocess.run([HFNN, "report", "--db", str(db), "--format", "csv"], capture_output=True,
                                           text=True).stdout.splitlines() if l.startswith("tune,")]
    assert len(csv_rows) == 4 and all(",good," in l for l in csv_rows)


@pytest.mark.parametrize("busy_fraction", [0.5, 0.95])
def test_the_projection_is_on_gpu_busy_time_and_says_when_the_step_is_cpu_bound(db, busy_fraction):
    # As a GPU profile records it: busy time under the wall time. The profiler's CPU cost stretches
    # wall time, not kernel time, so the projection (and the shares) are on busy time; when the GPU
    # idled much of the step, tune says the gain shows only where the GPU is the bottleneck.
    with sqlite3.connect(db) as con:
        con.execute("UPDATE step_stats SET gpu_busy_ms = wall_ms * ?", (busy_fraction,))
        # one slow step (a part file written, say) moves a mean, not the median the projection takes
        con.execute("UPDATE step_stats SET wall_ms = wall_ms * 50 WHERE wall_ms = (SELECT max(wall_ms) FROM step_stats)")
    busy = statistics.median(b for (b,) in rows(db, "SELECT gpu_busy_ms FROM step_stats"))
    wall = statistics.median(w for (w,) in rows(db, "SELECT wall_ms FROM step_stats"))
    out = tune(db)
    assert out.returncode == 0, out.stderr
    report = subprocess.run([HFNN, "report", "--db", str(db), "--format", "json"], capture_output=True, text=True)
    p = json.loads(report.stdout)["tune"]["envs"][0]["projection"]
    assert p["basis"] == "gpu_busy" and abs(p["step_ms"] - busy) < 1e-6 and abs(p["wall_step_ms"] - wall) < 1e-6
    assert abs(p["speedup"] - busy / (busy - p["saved_ms"])) < 1e-9
    assert "of GPU busy time" in out.stdout
    assert ("CPU-bound under the profiler" in out.stdout) == (busy_fraction < 0.85)
    # The profile has no plain step (its script ended with the recorded steps): the projection says so.
    assert "No plain step (the script ended first" in out.stdout and "projected on the GPU busy time" in out.stdout


def _with_plain_step(db, plain_ms):
    """The profile as if its script had run on: a plain step of plain_ms timed after the recorded ones."""
    with sqlite3.connect(db) as con:
        con.execute("UPDATE runs SET plain_steps_requested = 10")
        con.execute("UPDATE ranks SET plain_steps = 10, plain_step_ms = ?", (plain_ms,))


@pytest.mark.parametrize("busy_fraction", [None, 0.3, 0.95])
def test_the_projection_is_end_to_end_on_the_plain_step_where_the_run_has_one(db, busy_fraction):
    # The profiler stretched a 10 ms step (the fixture's) that takes 4 ms without it: the projection,
    # the shares and the CPU-bound note are of the 4 ms step, whatever the GPU's busy time.
    _with_plain_step(db, 4.0)
    if busy_fraction is not None:
        with sqlite3.connect(db) as con:
            con.execute("UPDATE step_stats SET gpu_busy_ms = 4.0 * ?", (busy_fraction,))
    out = tune(db)
    assert out.returncode == 0, out.stderr
    data = json.loads(subprocess.run([HFNN, "report", "--db", str(db), "--format", "json"], capture_output=True,
                                     text=True).stdout)
    p = data["tune"]["envs"][0]["projection"]
    wall = statistics.median(w for (w,) in rows(db, "SELECT wall_ms FROM step_stats"))
    assert p["basis"] == "plain" and p["step_ms"] == p["plain_step_ms"] == 4.0 and p["wall_step_ms"] == pytest.approx(wall)
    assert p["speedup"] == pytest.approx(4.0 / (4.0 - p["saved_ms"])) and p["projected_step_ms"] == 4.0 - p["saved_ms"]
    assert p["ceiling"] == pytest.approx(4.0 / (4.0 - p["torch_ms"]))
    assert f"of the plain step (timed without the profiler; {wall:.2f} ms under it)" in out.stdout
    assert "No plain step" not in out.stdout
    # A key's share: its times here are CPU times (the fixture has no CUDA time), measured under the
    # profiler as the recorded steps were, so the share is of those steps' wall time, not of the
    # plain step (which would put the profiler's cost in the numerator only: shares over 100%).
    ((wall_total,),) = rows(db, "SELECT sum(wall_ms) FROM step_stats")
    for row in data["tune"]["envs"][0]["rows"]:
        ((us,),) = rows(db, "SELECT sum(cpu_total_us) FROM shape_stats WHERE op = 'layer_norm' AND affine = ?",
                        int(row["key"].endswith("affine=1")))
        assert row["share_pct"] == pytest.approx(100 * us / 1e3 / wall_total)
    # CPU-bound: the GPU busy under 85% of the plain step.
    assert ("CPU-bound without the profiler too" in out.stdout) == (busy_fraction == 0.3)
    assert "CPU-bound under the profiler" not in out.stdout


def test_savings_as_large_as_the_step_have_no_bound_in_json_and_text(db):
    # GPU busy 0.1 ms a step, torch's keys 0.4 ms: the projection and the ceiling have no bound
    # (JSON null, "no bound" in words), never a made-up 1.0x.
    with sqlite3.connect(db) as con:
        con.execute("UPDATE step_stats SET gpu_busy_ms = 0.1")
    out = tune(db)
    assert out.returncode == 0, out.stderr
    p = json.loads(subprocess.run([HFNN, "report", "--db", str(db), "--format", "json"], capture_output=True,
                                  text=True).stdout)["tune"]["envs"][0]["projection"]
    assert p["speedup"] is None and p["ceiling"] is None and p["projected_step_ms"] == 0
    assert "(no bound)" in out.stdout and "all of it, so no bound" in out.stdout


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (scripts/setup.sh installs it on Debian)")
def test_the_html_report_shows_the_winners_and_renders(db, tmp_path):
    assert tune(db).returncode == 0
    page = tmp_path / "report.html"
    assert subprocess.run([HFNN, "report", "--db", str(db), "--format", "html", "-o", str(page)]).returncode == 0
    html = page.read_text()
    assert "Tuned on Fake GPU" in html and "Projected step time" in html and "<code>good</code>" in html
    assert "<script" not in html
    out = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                          "--log-level=0", "--window-size=1200,2000", f"--screenshot={tmp_path / 'r.png'}",
                          page.as_uri()], capture_output=True, text=True, timeout=120)
    assert [line for line in out.stderr.splitlines() if ":CONSOLE" in line] == []
    assert (tmp_path / "r.png").stat().st_size > 20_000


def test_noise_keeps_torch(db):
    # The fastest correct variant at 98.5 µs against torch's 100: within the noise, torch stays the choice.
    out = tune(db, env={"FAKE_TUNE_GOOD_US": "98.5"})
    assert out.returncode == 0, out.stderr
    assert rows(db, "SELECT DISTINCT winner FROM tune_winners") == [("torch",)]


def test_a_second_run_skips_what_is_tuned_and_force_redoes_it(db, tmp_path):
    log = tmp_path / "calls.log"
    env = {"FAKE_TUNE_LOG": str(log)}
    assert tune(db, env=env).returncode == 0
    again = tune(db, env=env)
    assert again.returncode == 0 and "2 already tuned" in again.stdout
    forced = tune(db, "--force", "--top", "1", env=env)
    assert forced.returncode == 0
    assert log.read_text().split() == ["2", "0", "1"]  # keys measured by each run
    assert rows(db, "SELECT count(*) FROM tune_results WHERE candidate = 'torch'") == [(4,)]  # replaced, not added
    # Another hfnn version is another environment: its table is tuned afresh, the first one kept.
    other = tune(db, env=dict(env, FAKE_TUNE_HFNN="0.2.0"))
    assert other.returncode == 0 and log.read_text().split()[-1] == "2"
    assert rows(db, "SELECT count(*) FROM tune_envs") == [(2,)]


@pytest.mark.parametrize("fault", ["die", "stray"])
def test_a_worker_that_dies_or_breaks_the_protocol_fails_the_run_and_keeps_what_finished(db, fault):
    env = {"FAKE_TUNE_DIE_AFTER": "1"} if fault == "die" else {"FAKE_TUNE_STRAY": "1"}
    out = tune(db, env=env)
    assert out.returncode == 1
    assert ("exited while measuring" if fault == "die" else "out of turn") in out.stderr
    assert rows(db, "SELECT count(DISTINCT key) FROM tune_winners") == [(1,)]


def test_ctrl_c_keeps_the_keys_already_tuned(db):
    env = dict(os.environ, HFNN_TUNE_WORKER=str(FAKE_WORKER), FAKE_TUNE_SLEEP="1.5")
    proc = subprocess.Popen([HFNN, "tune", "--db", str(db), "--python", sys.executable], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    deadline = time.time() + 60
    for line in proc.stdout:
        if line.startswith("[1/2]") or time.time() > deadline:
            break
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: hfnn and its worker
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "1 key(s) finished are kept" in err
    assert rows(db, "SELECT count(DISTINCT key) FROM tune_winners") == [(1,)]


@requires_gpu
def test_tune_on_the_gpu_measures_real_kernels_and_rejects_the_planted_one(db):
    out = tune(db, "--seconds-per-key", "0.5", fake=False, env={"HFNN_TUNE_PLANT_WRONG": "1"})
    assert out.returncode == 0, out.stderr
    results = rows(db, "SELECT key, pass, candidate, median_us, max_error, accepted FROM tune_results")
    planted = [r for r in results if r[2] == "planted_wrong"]
    assert len(planted) == 4 and all(r[5] == 0 for r in planted)
    honest = [r for r in results if r[2] != "planted_wrong"]
    assert all(r[5] == 1 and r[3] > 0 for r in honest), honest  # every real variant is correct and timed
    assert {r[2] for r in honest} >= {"torch", "fwd_regs_tpr8", "bwd_block"}
    winners = rows(db, "SELECT winner FROM tune_winners")
    assert len(winners) == 4 and all(w != "planted_wrong" for (w,) in winners)
