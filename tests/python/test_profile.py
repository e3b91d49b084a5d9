"""`hfnn profile` and `hfnn report` on the CPU path: a real training script in a child process,
its profile merged into SQLite, and every way a run can end or a database can be wrong."""
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

HFNN = shutil.which("hfnn")
SCRIPT = Path(__file__).parent / "scripts" / "tiny_train.py"
pytestmark = pytest.mark.skipif(HFNN is None, reason="the hfnn executable is not on PATH: run scripts/setup.sh")


def profile(tmp_path, *args, db="shapes.db", **kw):
    cmd = [HFNN, "profile", "--db", str(tmp_path / db), "--python", sys.executable, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path, **kw)


def rows(db, sql, *params):
    with sqlite3.connect(db) as con:
        return con.execute(sql, params).fetchall()


def test_profile_records_steps_ops_and_layer_norm_shapes(tmp_path):
    out = profile(tmp_path, "--warmup", "1", "--steps", "3", str(SCRIPT), "6")
    assert out.returncode == 0, out.stderr
    db = tmp_path / "shapes.db"
    assert "Run 1 added to" in out.stdout and "LayerNorm input shapes" in out.stdout
    ((steps_recorded, exit_code, warmup),) = rows(db, "SELECT steps_recorded, exit_code, warmup FROM runs")
    assert (steps_recorded, exit_code, warmup) == (3, 0, 1)
    assert len(rows(db, "SELECT * FROM step_stats WHERE run_id = 1")) == 3
    shapes = rows(db, "SELECT shape, normalized_shape, dtype, affine, phase, calls FROM shape_stats WHERE op = 'layer_norm'"
                      " ORDER BY affine, phase")
    # Two LayerNorms (with and without affine), forward and backward, 3 recorded steps each.
    assert shapes == [("[16,64]", "[64]", "float32", 0, "bwd", 3), ("[16,64]", "[64]", "float32", 0, "fwd", 3),
                      ("[16,64]", "[64]", "float32", 1, "bwd", 3), ("[16,64]", "[64]", "float32", 1, "fwd", 3)]
    ops = dict(rows(db, "SELECT name || '/' || phase, calls FROM op_stats"))
    assert ops["aten::addmm/fwd"] == 6 and ops["aten::native_layer_norm_backward/bwd"] == 6
    # Every GEMM's shape too, for the advice (profiles/advice.h): one record per call.
    assert rows(db, "SELECT sum(calls) FROM shape_stats WHERE op = 'gemm' AND phase = 'fwd' AND flags LIKE 'op=addmm,%'"
                ) == [(6,)]
    assert all(r[0] >= r[1] >= 0 for r in rows(db, "SELECT cpu_total_us, cpu_self_us FROM op_stats"))


def test_runs_accumulate_and_report_reads_them_back(tmp_path):
    for _ in range(2):
        assert profile(tmp_path, "-q", str(SCRIPT), "4").returncode == 0
    db = str(tmp_path / "shapes.db")
    report = subprocess.run([HFNN, "report", "--db", db, "--run", "1", "--format", "json"], capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    assert data["run"]["id"] == 1 and data["run"]["steps_recorded"] == 2  # 4 steps - 2 warm-up (defaults)
    assert data["shapes"][0]["run_pct"] == pytest.approx(50.0)  # two LayerNorm shapes, one call each a step
    assert abs(sum(data["categories"].values()) - 1) < 1e-6
    import torch

    if torch.cuda.is_available():
        # The script's tensors are on the CPU: no CUDA time, so CPU time ranks the ops.
        assert data["run"]["gpu"] == torch.cuda.get_device_name() and data["time_basis"] == "cpu"
    else:
        assert data["run"]["gpu"] is None and "CUDA columns are empty" in data["cuda_note"]
    text_file = tmp_path / "report.txt"
    assert subprocess.run([HFNN, "report", "--db", db, "-o", str(text_file)]).returncode == 0
    assert "hfnn profile, run 2" in text_file.read_text()


def test_backward_nodes_name_the_forward_op_that_made_them(tmp_path):
    assert profile(tmp_path, "-q", str(SCRIPT), "4").returncode == 0
    links = dict(rows(tmp_path / "shapes.db", "SELECT name, forward_op FROM op_stats WHERE phase = 'bwd' AND forward_op != ''"))
    assert links["NativeLayerNormBackward0"] == "aten::layer_norm"  # through autograd's sequence numbers
    assert links["AddmmBackward0"] == "aten::addmm" and links["ReluBackward0"] == "aten::relu"
    report = subprocess.run([HFNN, "report", "--db", str(tmp_path / "shapes.db"), "--format", "json"], capture_output=True,
                            text=True)
    ops = {o["name"]: o for o in json.loads(report.stdout)["ops"]}
    assert all(o["forward_op"] == links.get(n, o["forward_op"]) for n, o in ops.items())


CHAIN_SCRIPT = """
import torch
p = torch.nn.Parameter(torch.randn(8))
opt = torch.optim.SGD([p], lr=1e-3)
for _ in range(4):
    y = p
    for _ in range(200):
        y = (y * 1.0001 + 1.0) * 0.5  # MulBackward0 twice, AddBackward0 once, 200 times a step
    y.sum().backward()
    opt.step()
    opt.zero_grad()
"""


def test_backward_records_count_under_their_own_names(tmp_path):
    # The engine's "autograd::engine::evaluate_function: X" records carry names that live only as
    # long as the record: each must count under its own name, as often as node X itself ran.
    (tmp_path / "chain.py").write_text(CHAIN_SCRIPT)
    out = profile(tmp_path, "--warmup", "1", "--steps", "3", "chain.py")
    assert out.returncode == 0, out.stderr
    calls = dict(rows(tmp_path / "shapes.db", "SELECT name, calls FROM op_stats WHERE phase = 'bwd'"))
    prefix = "autograd::engine::evaluate_function: "
    assert (calls["MulBackward0"], calls["AddBackward0"]) == (3 * 400, 3 * 200)
    for node in ("MulBackward0", "AddBackward0", "SumBackward0"):
        assert calls[prefix + node] == calls[node], (node, calls)


THREADS_SCRIPT = """
import threading, torch
p = torch.nn.Parameter(torch.randn(8))
opt = torch.optim.SGD([p], lr=1e-3)
a = torch.ones(4)


def work():
    for _ in range(20):
        torch.sub(a, 1.0)


for _ in range(5):
    for _ in range(30):
        torch.add(a, 1.0)
    worker = threading.Thread(target=work)  # a new thread a step: each ends, the next takes its place
    worker.start()
    worker.join()
    (p * 2).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def test_ops_of_every_thread_are_counted_and_the_warmup_is_not(tmp_path):
    # Each thread adds to its own totals without a lock; the part sums them, less the warm-up.
    (tmp_path / "threads.py").write_text(THREADS_SCRIPT)
    out = profile(tmp_path, "--warmup", "2", "--steps", "3", "threads.py")
    assert out.returncode == 0, out.stderr
    calls = dict(rows(tmp_path / "shapes.db", "SELECT name || '/' || phase, calls FROM op_stats"))
    assert (calls["aten::add/fwd"], calls["aten::sub/fwd"], calls["aten::mul/fwd"]) == (3 * 30, 3 * 20, 3)
    assert calls["MulBackward0/bwd"] == 3


BOXING_SCRIPT = """
import json, sys, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for _ in range(3):
    y = model(torch.randn(16, 32))
    for _ in range(int(sys.argv[2])):  # ops outside every record whose inputs are read
        y = y * 1.0
    y.square().mean().backward()
    opt.step()
    opt.zero_grad()
json.dump(json.loads(torch.ops.hfnn.profiler_snapshot()), open(sys.argv[1], "w"))
"""


def snapshots_with_more_ops(tmp_path, script, more, *args):
    """The collector's snapshot at the end of `script` (it writes it to argv[1]) profiled with
    --steps 0 and `args`, run twice: with 0 and with `more` extra ops a step (argv[2])."""
    (tmp_path / "snap.py").write_text(script)
    snaps = []
    for extra in (0, more):
        snap_path = tmp_path / f"snap-{extra}.json"
        out = profile(tmp_path, "-q", "--steps", "0", *args, "snap.py", str(snap_path), str(extra), db=f"snap-{extra}.db")
        assert out.returncode == 0, out.stderr
        snaps.append(json.loads(snap_path.read_text()))
    return snaps


def test_inputs_are_boxed_only_where_a_shape_is_read(tmp_path):
    # torch copies an op's inputs into IValues only for observers that ask for them: the collector
    # asks inside LayerNorm's and the GEMMs' records (nn.Linear's aten::linear, their backward
    # nodes; and torch's LSTM's), not for every op, and still records every LayerNorm and GEMM
    # shape, forward and backward. 40 more ops a step outside them are observed, not boxed.
    snaps = snapshots_with_more_ops(tmp_path, BOXING_SCRIPT, 40, "--warmup", "0")
    observers = [snap["observer"] for snap in snaps]
    for snap in snaps:
        calls = {}
        for shape in snap["shapes"]:
            calls[shape["op"], shape["phase"]] = calls.get((shape["op"], shape["phase"]), 0) + shape["calls"]
        # Per step: 1 LayerNorm; 2 addmm forward; mm for 1 + 2 gradients (the input needs none).
        assert calls == {("layer_norm", "fwd"): 3, ("layer_norm", "bwd"): 3, ("gemm", "fwd"): 6, ("gemm", "bwd"): 9}
    assert 0 < observers[0]["records_with_inputs"] == observers[1]["records_with_inputs"], observers
    assert observers[1]["records"] >= observers[0]["records"] + 3 * 40 * 2, observers  # each mul and its node
    assert 2 * observers[0]["records_with_inputs"] < observers[0]["records"], observers


GEMM_SCRIPT = """
import torch
from torch import nn
torch.manual_seed(0)
w = nn.Parameter(torch.randn(12, 20))
b3 = nn.Parameter(torch.randn(2, 20, 6))
att = nn.MultiheadAttention(16, 2, batch_first=True)
opt = torch.optim.SGD([w, b3, *att.parameters()], lr=1e-3)
for _ in range(4):
    y = torch.randn(5, 12) @ w
    z = torch.einsum("bij,bjk->bik", y.reshape(1, 5, 20).expand(2, 5, 20), b3)
    q = torch.randn(3, 7, 16)
    a, weights = att(q, q, q, need_weights=True)
    direct = torch.mm(torch.randn(3, 4), torch.randn(4, 9))
    (z.sum() + a.sum() + weights.sum() + direct.sum()).backward()
    opt.step()
    opt.zero_grad()
"""


def test_gemm_shapes_are_read_inside_matmul_einsum_attention_and_their_backward(tmp_path):
    # The advice's GEMM records need the GEMM's inputs, which torch boxes only inside the records
    # the collector names (collector.cpp, kBoxingRecords): @ (aten::matmul), einsum, the
    # MultiheadAttention scope (its need_weights path calls bmm itself; its projections F.linear),
    # and the GEMM backward nodes. A torch.mm called directly from Python is timed as an op, its
    # shape not read: that would take boxing every op's inputs.
    (tmp_path / "gemm.py").write_text(GEMM_SCRIPT)
    out = profile(tmp_path, "-q", "--warmup", "1", "--steps", "3", "gemm.py")
    assert out.returncode == 0, out.stderr
    db = tmp_path / "shapes.db"
    fwd = set(rows(db, "SELECT shape, flags FROM shape_stats WHERE op = 'gemm' AND phase = 'fwd' AND calls = 3"))
    assert fwd == {("[5,20,12]", "op=mm,tf32=0"),  # @
                   ("[5,6,20]", "op=bmm,batch=2,tf32=0"),  # einsum
                   ("[21,48,16]", "op=mm,tf32=0"), ("[21,16,16]", "op=addmm,tf32=0"),  # the projections
                   ("[7,7,8]", "op=bmm,batch=6,tf32=0"), ("[7,8,7]", "op=bmm,batch=6,tf32=0")}  # q k^T, p v
    bwd = {shape for shape, in rows(db, "SELECT shape FROM shape_stats WHERE op = 'gemm' AND phase = 'bwd'")}
    assert {"[12,20,5]", "[5,20,6]", "[20,6,5]", "[48,16,21]", "[7,8,7]"} <= bwd, bwd  # w, y, b3, in_proj, attention
    assert "[3,9,4]" not in bwd | {shape for shape, _ in fwd}
    assert rows(db, "SELECT calls FROM op_stats WHERE name = 'aten::mm' AND phase = 'fwd'") == [(9,)]  # with torch.mm


HOST_COPY_SCRIPT = """
import json, sys, torch, hfnn
x = torch.randn(64, 64, device="cuda")
h = x.bfloat16()
for _ in range(5):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        for _ in range(int(sys.argv[2])):
            torch.softmax(h, -1)  # autocast casts h to float32 inside aten::softmax's record
    s = x.sum(0)
    s.cpu()
    s.to("cpu", non_blocking=True)
    s.tolist()
    hfnn.step()
torch.cuda.synchronize()
json.dump(json.loads(torch.ops.hfnn.profiler_snapshot()), open(sys.argv[1], "w"))
"""


@pytest.mark.skipif(not __import__("torch").cuda.is_available(),
                    reason="no CUDA device: copies to the host and autocast's casts run on the GPU machine")
def test_copies_to_the_host_are_read_where_python_calls_them_and_casts_inside_ops_are_not_boxed(tmp_path):
    # .cpu(), .to("cpu", non_blocking=True) and .tolist() reach aten::copy_ through aten::to called
    # from Python: their inputs are boxed and each is a copy_to_host record. The casts autocast makes
    # inside aten::softmax's record are aten::to too, but not called from Python: 20 more a step
    # leave the boxed records as they were.
    snaps = snapshots_with_more_ops(tmp_path, HOST_COPY_SCRIPT, 20, "--warmup", "1")
    observers = [snap["observer"] for snap in snaps]
    for snap in snaps:
        copies = {(c["shape"], c["dtype"], c["flags"]): c["calls"] for c in snap["shapes"] if c["op"] == "copy_to_host"}
        assert copies == {("[64]", "float32", "non_blocking=0"): 8, ("[64]", "float32", "non_blocking=1"): 4}, copies
    assert 0 < observers[0]["records_with_inputs"] == observers[1]["records_with_inputs"], observers
    assert observers[1]["records"] >= observers[0]["records"] + 5 * 20 * 2, observers  # softmax and its cast


HFNN_LAYER_NORM_SCRIPT = """
import torch, hfnn
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), hfnn.nn.LayerNorm(64), torch.nn.ReLU(),
                            hfnn.nn.LayerNorm(64, elementwise_affine=False))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for _ in range(4):
    model(torch.randn(16, 32)).square().mean().backward()
    opt.step()
    opt.zero_grad()
"""


def test_hfnn_layer_norm_shapes_are_recorded_once_per_call(tmp_path):
    # hfnn.nn.LayerNorm calls hfnn::layer_norm from Python; on the CPU it runs torch's kernel inside
    # it, whose record (the innermost) keeps the shape: once a call, forward and backward.
    (tmp_path / "hfnn_ln.py").write_text(HFNN_LAYER_NORM_SCRIPT)
    out = profile(tmp_path, "--warmup", "1", "--steps", "3", "hfnn_ln.py")
    assert out.returncode == 0, out.stderr
    shapes = rows(tmp_path / "shapes.db", "SELECT shape, dtype, affine, phase, calls FROM shape_stats WHERE op ="
                                          " 'layer_norm' ORDER BY affine, phase")
    assert shapes == [("[16,64]", "float32", 0, "bwd", 3), ("[16,64]", "float32", 0, "fwd", 3),
                      ("[16,64]", "float32", 1, "bwd", 3), ("[16,64]", "float32", 1, "fwd", 3)]


def test_the_database_does_not_grow_with_steps(tmp_path):
    sizes = []
    for steps in (10, 400):
        out = profile(tmp_path, "-q", "--warmup", "0", "--steps", "0", str(SCRIPT), str(steps), db=f"s{steps}.db")
        assert out.returncode == 0, out.stderr
        sizes.append((tmp_path / f"s{steps}.db").stat().st_size)
    assert rows(tmp_path / "s400.db", "SELECT steps_recorded FROM runs") == [(400,)]
    assert sizes[1] <= sizes[0] + 8192 and sizes[1] < 1 << 20  # per-step rows only: a few pages at most


def test_manual_step_marker_without_optimizer(tmp_path):
    out = profile(tmp_path, "--warmup", "0", "--steps", "0", str(SCRIPT), "5", "manual-steps")
    assert out.returncode == 0, out.stderr
    assert rows(tmp_path / "shapes.db", "SELECT steps_recorded FROM runs") == [(5,)]


def test_failing_script_keeps_its_profile_and_exit_code(tmp_path):
    out = profile(tmp_path, "--warmup", "0", str(SCRIPT), "3", "raise")
    assert out.returncode == 1
    assert "the user's script failed" in out.stderr
    assert rows(tmp_path / "shapes.db", "SELECT exit_code, steps_recorded FROM runs") == [(1, 3)]


_STEPS_THEN_EXIT = """
import sys, torch
p = torch.nn.Parameter(torch.ones(4))
opt = torch.optim.SGD([p], lr=0.1)
for _ in range(int(sys.argv[1])):
    p.square().sum().backward()
    opt.step()
    opt.zero_grad()
sys.exit(int(sys.argv[2]))
"""


def test_a_script_with_no_more_steps_than_warmup_says_so_and_records_nothing(tmp_path):
    # A 2-step smoke run under the default --warmup 2: one line saying why the profile is empty, an
    # error exit, and no empty run for `hfnn tune` to pick up as the newest.
    (tmp_path / "smoke.py").write_text(_STEPS_THEN_EXIT)
    out = profile(tmp_path, "smoke.py", "2", "0")
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stderr.strip() == ("hfnn profile: smoke.py ran 2 steps, all inside --warmup 2: nothing recorded; run more "
                                  f"steps or pass --warmup 0 ({tmp_path / 'shapes.db'} is unchanged)")
    assert not (tmp_path / "shapes.db").exists()
    # A script that fails inside the warm-up says the same and keeps its own exit code.
    out = profile(tmp_path, "--warmup", "3", "smoke.py", "1", "7")
    assert out.returncode == 7 and "smoke.py ran 1 step, all inside --warmup 3: nothing recorded" in out.stderr
    assert not (tmp_path / "shapes.db").exists()
    # A command that runs no Python with hfnn records nothing either: an error, though it succeeded.
    out = subprocess.run([HFNN, "profile", "--db", str(tmp_path / "shapes.db"), "--", "true"], capture_output=True,
                         text=True, cwd=tmp_path)
    assert out.returncode == 1 and "nothing was recorded" in out.stderr and not (tmp_path / "shapes.db").exists()


def _interrupt_after_five_steps(cmd, signum):
    """Runs cmd in its own session, sends signum once it printed step 5 (SIGINT to the whole group,
    as a terminal's Ctrl-C does; SIGTERM to the process, as a job scheduler does). Returns the
    exit code the way a shell reports it (128 + signal when killed by one) and stderr. SIGINT starts
    at its default action, as in a terminal's foreground job (a shell's background job, or a test
    runner started as one, inherits it ignored, and Python then never raises KeyboardInterrupt)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    for line in proc.stdout:
        if line.startswith("step 5") or time.time() > deadline:
            break
    if signum == signal.SIGINT:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    return (128 - proc.returncode if proc.returncode < 0 else proc.returncode), err


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupted_script_keeps_its_profile_and_exit_code(tmp_path, signum):
    # The script's own exit code when interrupted, without hfnn (Python's: 130 after Ctrl-C on
    # most builds, 1 on some), is what hfnn profile must return too.
    plain, _ = _interrupt_after_five_steps([sys.executable, str(SCRIPT), "0", "loop"], signum)
    cmd = [HFNN, "profile", "--db", str(tmp_path / "shapes.db"), "--python", sys.executable, "--warmup", "0",
           "--steps", "0", str(SCRIPT), "0", "loop"]
    code, err = _interrupt_after_five_steps(cmd, signum)
    assert code == plain != 0, err[-2000:]
    ((exit_code, steps),) = rows(tmp_path / "shapes.db", "SELECT exit_code, steps_recorded FROM runs")
    assert exit_code == code and steps >= 5


def test_script_arguments_are_the_scripts_even_when_they_look_like_hfnns(tmp_path):
    args = ["--steps", "20", "--warmup", "5", "--db", "x.db", "-q", "--", "plain"]
    # The argv mode runs no torch op: nothing is recorded, which hfnn profile reports as an error (1).
    out = profile(tmp_path, "--steps", "1", str(SCRIPT), "argv", str(tmp_path / "argv.txt"), *args)
    assert out.returncode == 1 and "nothing was recorded" in out.stderr, out.stderr
    assert (tmp_path / "argv.txt").read_text().split("\n") == args
    out = subprocess.run([HFNN, "profile", "--db", str(tmp_path / "y.db"), "--", sys.executable, str(SCRIPT), "argv",
                          str(tmp_path / "argv2.txt"), "--steps", "3"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 1 and "nothing was recorded" in out.stderr, out.stderr
    assert (tmp_path / "argv2.txt").read_text().split("\n") == ["--steps", "3"]


def test_missing_script_is_one_line_and_writes_nothing(tmp_path):
    out = profile(tmp_path, "no_such_train.py")
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "no_such_train.py" in out.stderr
    assert not (tmp_path / "shapes.db").exists()


def test_bad_option_is_one_line(tmp_path):
    out = subprocess.run([HFNN, "profile", "--steps", "many", str(SCRIPT)], capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0


def _sqlite_file(path, statements):
    with sqlite3.connect(path) as con:
        for s in statements:
            con.execute(s)


@pytest.mark.parametrize("kind", ["not-sqlite", "other-app", "newer", "corrupt"])
def test_bad_database_is_refused_untouched_before_the_script_runs(tmp_path, kind):
    db = tmp_path / "shapes.db"
    if kind == "not-sqlite":
        db.write_text("these are my notes\n")
    elif kind == "other-app":
        _sqlite_file(db, ["CREATE TABLE accounts(id INTEGER)"])
    elif kind == "newer":
        _sqlite_file(db, ["CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT)",
                          "INSERT INTO meta VALUES ('app', 'hfnn'), ('schema_version', '99')"])
    else:
        _sqlite_file(db, ["CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT)",
                          "CREATE TABLE t(x)"] + [f"INSERT INTO t VALUES ({i})" for i in range(2000)])
        data = bytearray(db.read_bytes())
        data[100:4096] = b"\xff" * (4096 - 100)  # the first page's b-tree
        db.write_bytes(bytes(data))
    before = db.read_bytes()
    out = profile(tmp_path, str(SCRIPT), "2")
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip().count("\n") == 0 and str(db) in out.stderr
    assert {"not-sqlite": "not an hfnn database", "other-app": "not an hfnn database", "newer": "newer hfnn",
            "corrupt": "corrupt"}[kind] in out.stderr
    assert "step" not in out.stdout  # the script did not run
    assert db.read_bytes() == before


def test_report_without_database_is_a_clear_error(tmp_path):
    out = subprocess.run([HFNN, "report", "--db", str(tmp_path / "none.db")], capture_output=True, text=True)
    assert out.returncode == 2 and "no such database" in out.stderr


def test_startup_hook_does_nothing_without_the_variable():
    env = {k: v for k, v in os.environ.items() if not k.startswith("HFNN_")}
    out = subprocess.run([sys.executable, "-c", "import sys; print('hfnn' in sys.modules, 'torch' in sys.modules)"],
                         capture_output=True, text=True, env=env)
    assert out.stdout.strip() == "False False"


def test_startup_hook_waits_for_torch_in_a_venv_that_takes_torch_from_the_base(tmp_path):
    # A venv made with --system-site-packages, hfnn installed in it, torch only in the base: site
    # runs the venv's .pth files before the base site-packages are on sys.path, so torch (and hfnn,
    # which imports it) cannot be imported yet. Emulated here: the venv gets hfnn and hfnn_boot
    # through a path .pth that sorts first, and hfnn_startup.pth; torch stays in the base. The hook
    # must wait for the script's `import torch`, then start the collector, without a traceback.
    import venv

    import hfnn
    import hfnn_boot

    venv.create(tmp_path / "env", system_site_packages=True, with_pip=False)
    (site_dir,) = (tmp_path / "env").glob("lib/python*/site-packages")
    only = tmp_path / "only"
    only.mkdir()
    (only / "hfnn").symlink_to(Path(hfnn.__file__).parent)
    (only / "hfnn_boot.py").symlink_to(Path(hfnn_boot.__file__))
    (site_dir / "00_hfnn_only.pth").write_text(f"{only}\n")
    shutil.copy(Path(hfnn_boot.__file__).with_name("hfnn_startup.pth"), site_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HFNN_")}
    env.update(HFNN_PROFILE_DIR=str(tmp_path / "parts"), HFNN_PROFILE_WARMUP="0", HFNN_PROFILE_STEPS="0")
    (tmp_path / "parts").mkdir()
    probe = ("import sys; early = 'hfnn._startup' in sys.modules; import torch; "
             "print(early, 'hfnn._startup' in sys.modules, torch.ones(2).add(1).sum().item())")
    out = subprocess.run([str(tmp_path / "env" / "bin" / "python"), "-c", probe], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert out.stdout.split() == ["False", "True", "4.0"], (out.stdout, out.stderr)
    assert list((tmp_path / "parts").iterdir()), "the collector wrote no part"


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _render(page, png):
    """Headless Chromium: screenshot of `page`; returns the console lines it logged."""
    out = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                          "--log-level=0", "--window-size=1200,1400", f"--screenshot={png}", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    return [line for line in out.stderr.splitlines() if ":CONSOLE" in line]


def test_html_report_is_self_contained_and_complete(tmp_path):
    out = profile(tmp_path, "--report", "html", str(SCRIPT), "5")
    assert out.returncode == 0, out.stderr
    page = tmp_path / "shapes-run1.html"
    assert f"report: {page}" in out.stdout
    html = page.read_text()
    for needed in ("Where the time goes", "Top ops by CPU self time", "LayerNorm input shapes", "Step time per rank",
                   "<code>[16,64]</code>", "aten::native_layer_norm"):
        assert needed in html, needed
    assert "<script" not in html and "http://" not in html and "https://" not in html  # no network, no code


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (scripts/setup.sh installs it on Debian)")
def test_html_report_renders_in_a_real_browser_without_console_errors(tmp_path):
    # The check itself works: a page that logs to the console is caught.
    noisy = tmp_path / "noisy.html"
    noisy.write_text('<html><body><script>console.error("hfnn-check")</script></body></html>')
    assert any("hfnn-check" in line for line in _render(noisy, tmp_path / "noisy.png"))

    assert profile(tmp_path, "-q", str(SCRIPT), "5").returncode == 0
    page = tmp_path / "report.html"
    assert subprocess.run([HFNN, "report", "--db", str(tmp_path / "shapes.db"), "--format", "html", "-o", str(page)]).returncode == 0
    png = tmp_path / "report.png"
    assert _render(page, png) == []
    assert png.stat().st_size > 20_000  # a rendered page, not a blank one


def _cuda_available():
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(not _cuda_available(), reason="no CUDA device: the CUPTI path runs on the GPU machine")
def test_cuda_time_lands_on_the_ops_that_launched_it(tmp_path):
    out = profile(tmp_path, "--warmup", "1", "--steps", "3", str(SCRIPT), "6", "cuda")
    assert out.returncode == 0, out.stderr
    db = tmp_path / "shapes.db"
    ops = {f"{n}/{p}": (s, t) for n, p, s, t in rows(db, "SELECT name, phase, cuda_self_us, cuda_total_us FROM op_stats")}
    assert ops["aten::addmm/fwd"][0] > 0  # the GEMM kernel is the op's own
    assert ops["aten::layer_norm/fwd"][0] == 0 < ops["aten::layer_norm/fwd"][1]  # its kernel is native_layer_norm's
    assert ops["aten::native_layer_norm/fwd"][0] > 0
    assert all(t >= s for s, t in ops.values())
    assert all(t > 0 for (t,) in rows(db, "SELECT cuda_total_us FROM shape_stats"))
    assert len(rows(db, "SELECT * FROM kernel_stats")) > 3
    steps = rows(db, "SELECT wall_ms, gpu_busy_ms FROM step_stats")
    assert len(steps) == 3 and all(b is not None and 0 < b <= w for w, b in steps)  # busy: kernels' union
    (kernel_ms,) = rows(db, "SELECT sum(cuda_us) / 1e3 FROM kernel_stats")[0]
    assert kernel_ms >= sum(b for _, b in steps) * 0.999  # one stream: the union is at most the sum
    assert "Top kernels by CUDA time" in out.stdout and "ranked by CUDA self time" in out.stdout


CUPTI_SCRIPT = """
import json, sys, torch
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for _ in range(4):
    model(torch.randn(16, 32, device="cuda")).square().mean().backward()
    opt.step()
    opt.zero_grad()
torch.cuda.synchronize()
json.dump(json.loads(torch.ops.hfnn.profiler_snapshot()), open(sys.argv[1], "w"))
"""


@pytest.mark.skipif(not _cuda_available(), reason="no CUDA device: the CUPTI path runs on the GPU machine")
@pytest.mark.parametrize("apis", ["callbacks", "launch", "all"])
def test_cupti_traces_the_launch_calls_and_every_kernel_finds_its_op(tmp_path, apis):
    # Kernels find their ops by CUPTI callbacks on the launch, memcpy and memset calls
    # (HFNN_CUPTI_JOIN=callbacks), or by CUPTI's external correlation (default), whose records come for the API
    # calls it traces: those calls alone, or every call (HFNN_CUPTI_API=all, as before): each way
    # each kernel is joined to the op that launched it.
    (tmp_path / "cupti.py").write_text(CUPTI_SCRIPT)
    env = {"callbacks": dict(os.environ, HFNN_CUPTI_JOIN="callbacks"), "launch": None,
           "all": dict(os.environ, HFNN_CUPTI_API="all")}[apis]
    out = profile(tmp_path, "-q", "--warmup", "0", "--steps", "0", "cupti.py", str(tmp_path / "snap.json"), env=env)
    assert out.returncode == 0, out.stderr
    snap = json.loads((tmp_path / "snap.json").read_text())
    expected = {"callbacks": "none: kernels joined by callbacks on the launch, memcpy and memset calls",
                "launch": "launch, memcpy and memset calls", "all": "every runtime and driver API call"}[apis]
    assert snap["meta"]["cupti_api"].startswith(expected), snap["meta"]
    assert snap["meta"]["cupti_join"] == ("callbacks" if apis == "callbacks" else "external correlation"), snap["meta"]
    records = snap["gpu_records"]
    assert records["attributed"] > 20 and records["no_correlation"] <= 0.01 * records["drained"], records
    ops = {o["name"]: o for o in snap["ops"] if o["phase"] == "fwd"}
    assert ops["aten::addmm"]["cuda_self_us"] > 0 and ops["aten::native_layer_norm"]["cuda_self_us"] > 0


AUTOCAST_SCRIPT = """
import sys, torch, hfnn
layer = (hfnn.nn.LayerNorm if sys.argv[1] == "hfnn" else torch.nn.LayerNorm)(64).cuda()
lin = torch.nn.Linear(32, 64).cuda()
opt = torch.optim.SGD([*layer.parameters(), *lin.parameters()], lr=0.1)
x = torch.randn(16, 32, device="cuda")
for _ in range(4):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = layer(lin(x))  # a bfloat16 input, which autocast casts to float32 for LayerNorm
    y.float().sum().backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.skipif(not _cuda_available(), reason="no CUDA device: CUDA autocast runs on the GPU machine")
@pytest.mark.parametrize("module", ["torch", "hfnn"])
def test_autocast_layer_norm_is_recorded_once_with_the_dtype_its_kernel_sees(tmp_path, module):
    # Autocast calls layer_norm again after the cast: one record per call, in float32, the key
    # that HFNN_DISPATCH_DB looks up.
    (tmp_path / "autocast.py").write_text(AUTOCAST_SCRIPT)
    out = profile(tmp_path, "--warmup", "1", "--steps", "3", "autocast.py", module)
    assert out.returncode == 0, out.stderr
    shapes = rows(tmp_path / "shapes.db",
                  "SELECT shape, dtype, phase, calls FROM shape_stats WHERE op = 'layer_norm' ORDER BY phase")
    assert shapes == [("[16,64]", "float32", "bwd", 3), ("[16,64]", "float32", "fwd", 3)]
    # The Linear's GEMMs are recorded apart, for the advice, in the dtype autocast ran them in.
    gemms = rows(tmp_path / "shapes.db", "SELECT dtype, phase FROM shape_stats WHERE op = 'gemm' GROUP BY dtype, phase")
    assert ("bfloat16", "fwd") in gemms


LSTM_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lstm_lm.py"


def test_lstm_shapes_are_recorded_with_their_settings(tmp_path):
    out = profile(tmp_path, "--warmup", "1", "--steps", "2", str(LSTM_EXAMPLE), "--steps", "3", "--warmup", "1",
                  "--device", "cpu")
    assert out.returncode == 0, out.stderr
    assert "LSTM input shapes" in out.stdout
    ((shape, dtype, flags, calls),) = rows(tmp_path / "shapes.db",
                                           "SELECT shape, dtype, flags, calls FROM shape_stats WHERE op = 'lstm'")
    assert (shape, dtype, calls) == ("[4,32,64]", "float32", 2)
    assert flags == "input=64,hidden=64,layers=1,bidirectional=0,batch_first=1,bias=1,proj=0,dropout=0"
    # The scope that lets the collector read aten::lstm's inputs is no op of its own.
    assert rows(tmp_path / "shapes.db", "SELECT count(*) FROM op_stats WHERE name LIKE 'hfnn.inputs%'") == [(0,)]


_LSTM_AUTOCAST = r"""
import json, sys, torch, hfnn
device = sys.argv[1]
torch.backends.mkldnn.enabled = False  # oneDNN's 16-bit LSTM needs AVX512-BF16; torch's own cell runs on any CPU
torch.manual_seed(0)
net, net64 = torch.nn.LSTM(8, 16, batch_first=True).to(device), torch.nn.LSTM(6, 16).double().to(device)
opt = torch.optim.SGD([*net.parameters(), *net64.parameters()], lr=0.1)
keys = {}  # input shape -> the dtype hfnn's dispatch looks the call's key up in
for _ in range(2):
    x, plain = torch.randn(2, 5, 8, device=device), torch.randn(3, 4, 8, device=device)
    x64 = torch.randn(5, 2, 6, device=device, dtype=torch.float64)
    with torch.autocast(device, dtype=torch.bfloat16):
        y, z = net(x)[0], net64(x64)[0]
        keys.update({str(list(t.shape)).replace(" ", ""): str(hfnn.nn._lstm_compute_dtype(t)) for t in (x, x64)})
    w = net(plain)[0]
    keys[str(list(plain.shape)).replace(" ", "")] = str(hfnn.nn._lstm_compute_dtype(plain))
    (y.float().sum() + z.sum() + w.sum()).backward()
    opt.step()
    opt.zero_grad()
json.dump({k: v.replace("torch.", "") for k, v in keys.items()}, open(sys.argv[2], "w"))
"""


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not _cuda_available(), reason="no CUDA device: CUDA autocast runs on the GPU machine"))])
def test_lstm_under_autocast_is_recorded_in_the_dtype_dispatch_looks_up(tmp_path, device):
    # aten::lstm is not cast by autocast (cuDNN's _cudnn_rnn is, further down): its input is float32
    # under bfloat16 autocast, but the call computes in a 16-bit dtype and hfnn.nn looks its key up
    # in that dtype (_lstm_compute_dtype). Recorded as float32, every LSTM of a tuned autocast run was
    # "shape not tuned". float64 stays float64; outside autocast the input's dtype.
    script = tmp_path / "lstm_autocast.py"
    script.write_text(_LSTM_AUTOCAST)
    out = profile(tmp_path, "-q", "--warmup", "0", str(script), device, str(tmp_path / "keys.json"))
    assert out.returncode == 0, out.stderr
    recorded = dict(rows(tmp_path / "shapes.db", "SELECT shape, dtype FROM shape_stats WHERE op = 'lstm'"))
    # On CUDA cuDNN's autocast wrapper casts to half whatever the autocast dtype: float16 there.
    low = "float16" if device == "cuda" else "bfloat16"
    assert recorded == {"[2,5,8]": low, "[5,2,6]": "float64", "[3,4,8]": "float32"}
    assert recorded == json.loads((tmp_path / "keys.json").read_text())


_LSTM_SETTINGS = r"""
import torch
from torch import nn
torch.manual_seed(0)
nets = [nn.LSTM(16, 32, num_layers=2, dropout=0.5, bidirectional=True),   # seq-first, dropout between layers
        nn.LSTM(16, 32, proj_size=8, batch_first=True, bias=False)]
for step in range(3):
    nets[0](torch.randn(5, 3, 16))[0].sum().backward()
    nets[1](torch.randn(3, 5, 16))[0].sum().backward()
"""


def test_lstm_projection_and_dropout_are_recorded(tmp_path):
    # What the LSTM family's key reads (kernels/lstm/lstm_family.h): proj_size runs torch's path,
    # dropout between layers in training is part of the key.
    script = tmp_path / "lstm_settings.py"
    script.write_text(_LSTM_SETTINGS)
    out = profile(tmp_path, "-q", str(script))
    assert out.returncode == 0, out.stderr
    got = dict(rows(tmp_path / "shapes.db", "SELECT shape, flags FROM shape_stats WHERE op = 'lstm'"))
    assert got == {"[5,3,16]": "input=16,hidden=32,layers=2,bidirectional=1,batch_first=0,bias=1,proj=0,dropout=1",
                   "[3,5,16]": "input=16,hidden=32,layers=1,bidirectional=0,batch_first=1,bias=0,proj=8,dropout=0"}


def test_an_older_database_is_migrated_and_keeps_its_runs(tmp_path):
    assert profile(tmp_path, "-q", str(SCRIPT), "3").returncode == 0
    db = tmp_path / "shapes.db"
    with sqlite3.connect(db) as con:  # back to schema 1: no flags column
        con.execute("ALTER TABLE shape_stats DROP COLUMN flags")
        con.execute("ALTER TABLE op_stats DROP COLUMN forward_op")
        for table, column in (("runs", "plain_steps_requested"), ("ranks", "plain_steps"), ("ranks", "plain_step_ms"),
                              ("runs", "sample_every"), ("ranks", "unsampled_steps"), ("ranks", "unsampled_step_ms")):
            con.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        for table in ("tune_winners", "tune_results", "tune_envs"):
            con.execute(f"DROP TABLE {table}")
        con.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    assert profile(tmp_path, "-q", str(SCRIPT), "3").returncode == 0
    assert rows(db, "SELECT value FROM meta WHERE key = 'schema_version'") == [("6",)]
    assert rows(db, "SELECT count(*) FROM tune_winners") == [(0,)]  # and the tune tables of schema 3
    assert [r[0] for r in rows(db, "SELECT id FROM runs ORDER BY id")] == [1, 2]
    assert rows(db, "SELECT DISTINCT flags FROM shape_stats WHERE op = 'layer_norm'") == [("",)]
    # The first run predates the plain step (NULL: not timed), the second asked for the default 10.
    assert rows(db, "SELECT plain_steps_requested FROM runs ORDER BY id") == [(None,), (10,)]
    # Likewise --sample (NULL: every recorded step in full, as then), and the default 1.
    assert rows(db, "SELECT sample_every FROM runs ORDER BY id") == [(None,), (1,)]


def test_csv_report_has_the_same_content_as_json(tmp_path):
    import csv
    import io

    assert profile(tmp_path, "-q", str(SCRIPT), "4").returncode == 0
    db = str(tmp_path / "shapes.db")
    as_json = json.loads(subprocess.run([HFNN, "report", "--db", db, "--format", "json"], capture_output=True, text=True).stdout)
    as_csv = list(csv.DictReader(io.StringIO(
        subprocess.run([HFNN, "report", "--db", db, "--format", "csv"], capture_output=True, text=True).stdout)))
    ops = [r for r in as_csv if r["section"] == "op"]
    assert [r["name"] for r in ops] == [o["name"] for o in as_json["ops"]]
    assert float(ops[0]["cpu_self_us"]) == pytest.approx(as_json["ops"][0]["cpu_self_us"])
    shapes = [r for r in as_csv if r["section"] == "shape"]
    assert [(r["shape"], r["affine"]) for r in shapes] == [(s["shape"], "1" if s["affine"] else "0") for s in as_json["shapes"]]
    assert [int(r["steps"]) for r in as_csv if r["section"] == "steps"] == [s["steps"] for s in as_json["steps"]]


TRANSFORMER_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "transformer.py"


def test_multihead_attention_shapes_are_recorded_with_their_settings(tmp_path):
    out = profile(tmp_path, "--warmup", "1", "--steps", "2", str(TRANSFORMER_EXAMPLE), "--steps", "3", "--warmup", "1",
                  "--device", "cpu")
    assert out.returncode == 0, out.stderr
    db = tmp_path / "shapes.db"
    ((shape, dtype, flags, calls),) = rows(db, "SELECT shape, dtype, flags, calls FROM shape_stats"
                                               " WHERE op = 'multihead_attention'")
    assert (shape, dtype) == ("[8,32,64]", "float32")
    assert calls == 2 * 2  # two recorded steps, two layers
    assert "embed=64,heads=4" in flags and "batch_first=1" in flags and "need_weights=0" in flags
    # The labelling scope is not an op of its own.
    assert rows(db, "SELECT count(*) FROM op_stats WHERE name LIKE 'hfnn.shape|%'") == [(0,)]
    assert "MultiheadAttention query shapes" in out.stdout


DDP_SCRIPT = Path(__file__).parent / "scripts" / "ddp_train.py"


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun_gives_one_profile_with_every_rank(tmp_path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                "--master_port", str(_free_port())]
    out = subprocess.run([HFNN, "profile", "--db", str(tmp_path / "shapes.db"), "--warmup", "1", "--steps", "3",
                          "--plain-steps", "2", "--", *torchrun, str(DDP_SCRIPT), "8"], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    db = tmp_path / "shapes.db"
    assert rows(db, "SELECT world_size FROM runs") == [(2,)]
    assert rows(db, "SELECT rank, steps_recorded FROM ranks ORDER BY rank") == [(0, 3), (1, 3)]
    # Each rank timed its own plain steps (1 + 3 + 1 + 2 of its 8).
    plain = rows(db, "SELECT rank, plain_steps, plain_step_ms FROM ranks ORDER BY rank")
    assert [r[:2] for r in plain] == [(0, 2), (1, 2)] and all(ms > 0 for _, _, ms in plain)
    # Rank 1 trains on twice the batch: each rank's own LayerNorm shape is there.
    assert rows(db, "SELECT DISTINCT rank, shape FROM shape_stats WHERE op = 'layer_norm' ORDER BY rank") == [
        (0, "[16,64]"), (1, "[32,64]")]
    report = json.loads(subprocess.run([HFNN, "report", "--db", str(db), "--format", "json"],
                                       capture_output=True, text=True).stdout)
    assert [s["rank"] for s in report["steps"]] == [0, 1]
    assert [s["plain_step_ms"] for s in report["steps"]] == pytest.approx([ms for _, _, ms in plain])
    assert report["profiler_cost"]["plain_step_ms"] == pytest.approx((plain[0][2] + plain[1][2]) / 2)
    assert all(0 < s["communication_share"] < 1 for s in report["steps"])  # gloo all-reduce of the gradients
    assert "communication" in report["categories"]
