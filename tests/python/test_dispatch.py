"""HFNN_DISPATCH_DB: training with the tuned winners and no code change, and every fault that must
not stop training. The tables come from a real `hfnn profile` of tiny_train.py and `hfnn tune`
with the stand-in worker (tests/python/scripts/fake_tune_worker.py) saying this machine's versions,
so they are the tables the real chain writes; on a GPU the winners are real variants and the
calls are checked to run them."""
import atexit
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import hfnn
from conftest import requires_gpu

HFNN = shutil.which("hfnn")
SCRIPTS = Path(__file__).parent / "scripts"
TRAIN = SCRIPTS / "dispatch_train.py"
pytestmark = pytest.mark.skipif(HFNN is None, reason="the hfnn executable is not on PATH: run scripts/setup.sh")


# Each `hfnn profile` and `hfnn tune` below starts Python and torch (on the GPU machine CUDA and CUPTI
# too): about 20 s a test there when every test made its own table. The profile is made once and
# each distinct tuning once, in this process, and every test gets a copy of its own to read.
_BUILT = Path(tempfile.mkdtemp(prefix="hfnn-test-dispatch-"))
atexit.register(shutil.rmtree, _BUILT, True)
_TUNED = {}


def _profiled():
    """A profile of tiny_train.py (4 steps), made once."""
    db = _BUILT / "profiled.db"
    if not db.exists():
        out = subprocess.run([HFNN, "profile", "-q", "--db", str(db), "--python", sys.executable,
                              str(SCRIPTS / "tiny_train.py"), "4"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
    return db


def tuned_db(path, device="cpu", fwd="fwd_block", bwd="bwd_block", good_us="50", **hello):
    """shapes.db with a profile of tiny_train.py and winners tuned for this machine's versions (and
    its GPU, on one): fwd/bwd win both keys unless good_us makes torch the winner. A copy at `path`
    of the table made once for these arguments."""
    key = (device, fwd, bwd, good_us, tuple(sorted(hello.items())))
    if key not in _TUNED:
        built = _BUILT / f"tuned{len(_TUNED)}.db"
        shutil.copyfile(_profiled(), built)
        env = dict(os.environ, HFNN_TUNE_WORKER=str(SCRIPTS / "fake_tune_worker.py"), FAKE_TUNE_TORCH=torch.__version__,
                   FAKE_TUNE_CUDA=torch.version.cuda or "", FAKE_TUNE_HFNN=hfnn.__version__,
                   FAKE_TUNE_WINNER_FWD=fwd, FAKE_TUNE_WINNER_BWD=bwd, FAKE_TUNE_GOOD_US=good_us)
        if device == "cuda":
            props = torch.cuda.get_device_properties(0)
            env.update(FAKE_TUNE_GPU=props.name, FAKE_TUNE_CC=f"{props.major}.{props.minor}",
                       FAKE_TUNE_SMS=str(props.multi_processor_count))
        env.update(hello)
        out = subprocess.run([HFNN, "tune", "-q", "--db", str(built), "--python", sys.executable],
                             capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        _TUNED[key] = built
    shutil.copyfile(_TUNED[key], path)
    return path


def train(db, device="cpu", steps=3, mode="", **env):
    e = dict(os.environ, **env)
    e.pop("HFNN_PROFILE_DIR", None)
    if db is not None:
        e["HFNN_DISPATCH_DB"] = str(db)
    out = subprocess.run([sys.executable, str(TRAIN), device, str(steps), mode], capture_output=True, text=True,
                         timeout=300, env=e)
    stats = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
    return out, stats


def ln(stats):
    """LayerNorm's counts in hfnn.dispatch_stats(): {"calls": {pass: {kernel: n}}, "fallbacks": ...}."""
    return stats["ops"]["layer_norm"]


def hfnn_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("hfnn")]


def test_the_hook_does_nothing_without_the_variable():
    env = {k: v for k, v in os.environ.items() if not k.startswith("HFNN_")}
    out = subprocess.run([sys.executable, "-c", "import sys; print('torch' in sys.modules, 'hfnn' in sys.modules)"],
                         capture_output=True, text=True, env=env)
    assert out.stdout.strip() == "False False"


def test_stats_list_every_family_of_the_build_with_its_passes():
    # The op library's families (kernels/common/family.cpp) and the Python side's tunable ones
    # (hfnn._families with a measure(); multi-head attention swaps modules but is not tuned yet)
    # are one list: each has its counts in the stats, even before any call.
    from hfnn import _families

    stats = hfnn.dispatch_stats()
    assert set(stats["ops"]) == {f.OP for f in _families.ALL if hasattr(f, "measure")}, stats
    assert ln(stats)["title"] == "LayerNorm" and set(ln(stats)["calls"]) == set(ln(stats)["fallbacks"]) == {"fwd", "bwd"}


@pytest.mark.parametrize("mode", ["", "to_hfnn"], ids=["torch-modules", "to_hfnn"])
def test_a_good_table_routes_every_layer_norm_and_counts_cpu_tensors(tmp_path, mode):
    # hfnn.to_hfnn's modules consult the same table as torch's LayerNorms do under the variable.
    db = tuned_db(tmp_path / "shapes.db")
    out, stats = train(db, steps=4, mode=mode)
    assert out.returncode == 0, out.stderr
    assert stats["active"] and stats["keys"] == 2 and stats["gpus"] == ["Fake GPU (sm 9.0, 132 SMs)"]
    # nn.LayerNorm and the custom module's F.layer_norm, forward and backward, 4 steps: all CPU here.
    assert ln(stats)["calls"] == {"fwd": {"torch": 8}, "bwd": {"torch": 8}}
    assert ln(stats)["fallbacks"]["fwd"] == {"CPU tensor": 8}
    lines = hfnn_lines(out.stderr)
    assert len(lines) == 1 and "not a CUDA tensor" in lines[0]  # once, not per call


def test_training_matches_torch_exactly_when_torch_kernels_run(tmp_path):
    db = tuned_db(tmp_path / "shapes.db")
    plain, _ = train(None, steps=3)
    routed, stats = train(db, steps=3)
    assert plain.returncode == 0 and routed.returncode == 0
    assert plain.stdout.splitlines()[0] == routed.stdout.splitlines()[0]  # the same loss to 6 digits
    assert ln(stats)["calls"]["fwd"]["torch"] == 6


@pytest.mark.parametrize("fault", ["missing", "corrupt", "foreign", "profile-only", "other-versions"])
def test_faults_warn_once_and_training_goes_on(tmp_path, fault):
    db = tmp_path / "shapes.db"
    if fault == "corrupt":
        tuned_db(db)
        data = bytearray(db.read_bytes())
        data[4096:12288] = b"\x5a" * 8192
        db.write_bytes(bytes(data))
    elif fault == "foreign":
        with sqlite3.connect(db) as con:
            con.execute("CREATE TABLE notes(x)")
    elif fault == "profile-only":
        subprocess.run([HFNN, "profile", "-q", "--db", str(db), "--python", sys.executable,
                        str(SCRIPTS / "tiny_train.py"), "3"], capture_output=True, timeout=120, check=True)
    elif fault == "other-versions":
        tuned_db(db, FAKE_TUNE_TORCH="1.13.0")
    before = db.read_bytes() if db.exists() else None
    out, stats = train(db, steps=2)
    assert out.returncode == 0, out.stderr
    lines = hfnn_lines(out.stderr)
    expected = {"missing": "no such file", "corrupt": "corrupt", "foreign": "not an hfnn database",
                "profile-only": "no tuned winners", "other-versions": "tuned with other versions"}[fault]
    assert any(expected in line for line in lines), lines
    assert any("runs torch's kernels" in line for line in lines)
    assert stats["active"] and stats["keys"] == 0 and ln(stats)["calls"]["fwd"] == {"torch": 4}
    assert (db.read_bytes() if db.exists() else None) == before  # read, never written


def test_strict_mode_turns_warnings_into_errors(tmp_path):
    out, _ = train(tmp_path / "missing.db", HFNN_STRICT="1")
    assert out.returncode == 1 and "loss" not in out.stdout
    assert out.stderr.strip().count("\n") == 0 and "HFNN_STRICT=1" in out.stderr and "no such file" in out.stderr
    db = tuned_db(tmp_path / "shapes.db")
    out, _ = train(db, HFNN_STRICT="1")  # a good table, but the input is a CPU tensor
    assert out.returncode != 0 and "HFNN_STRICT=1" in out.stderr and "not a CUDA tensor" in out.stderr


def test_verbose_prints_a_summary_at_exit(tmp_path):
    db = tuned_db(tmp_path / "shapes.db")
    out, _ = train(db, HFNN_VERBOSE="1")
    assert out.returncode == 0
    assert "hfnn: dispatch from" in out.stderr and "LayerNorm forward: 6 calls: torch 6" in out.stderr
    assert "torch because CPU tensor: 6" in out.stderr


def test_many_processes_open_the_same_table_at_once(tmp_path):
    db = tuned_db(tmp_path / "shapes.db")
    env = dict(os.environ, HFNN_DISPATCH_DB=str(db))
    procs = [subprocess.Popen([sys.executable, str(TRAIN), "cpu", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(4)]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [r[1] for r in results]
    assert all(json.loads(r[0].splitlines()[-1])["keys"] == 2 for r in results)


def test_checkpoints_save_and_load_under_dispatch(tmp_path):
    out, stats = train(tuned_db(tmp_path / "shapes.db"), mode="checkpoint")
    assert out.returncode == 0, out.stderr and stats["active"]


@requires_gpu
def test_on_the_gpu_the_winners_run(tmp_path):
    db = tuned_db(tmp_path / "shapes.db", device="cuda")
    out, stats = train(db, device="cuda", steps=4)
    assert out.returncode == 0, out.stderr
    assert ln(stats)["calls"] == {"fwd": {"fwd_block": 8}, "bwd": {"bwd_block": 8}}, stats
    assert hfnn_lines(out.stderr) == []
    plain, _ = train(None, device="cuda", steps=4)
    assert abs(float(plain.stdout.split()[1]) - float(out.stdout.split()[1])) < 1e-4


@requires_gpu
def test_on_the_gpu_torch_stays_where_it_won_and_untuned_shapes_follow_the_policy(tmp_path):
    db = tuned_db(tmp_path / "shapes.db", device="cuda", good_us="99")  # within the noise: torch wins
    out, stats = train(db, device="cuda", steps=2)
    assert ln(stats)["fallbacks"]["fwd"] == {"torch won the tuning": 4}, stats
    other = tuned_db(tmp_path / "other.db", device="cuda")
    with sqlite3.connect(other) as con:  # forget the non-affine key: untuned now
        con.execute("DELETE FROM tune_winners WHERE key LIKE '%affine=0'")
    _, torch_policy = train(other, device="cuda", steps=2)
    assert ln(torch_policy)["calls"]["fwd"] == {"fwd_block": 2, "torch": 2}
    assert ln(torch_policy)["fallbacks"]["fwd"] == {"shape not tuned": 2}
    _, heuristic = train(other, device="cuda", steps=2, HFNN_DISPATCH_POLICY="heuristic")
    # The untuned key runs the built-in choice (measured per GPU: a variant, or torch's kernel).
    assert sum(ln(heuristic)["calls"]["fwd"].values()) == 4 and "shape not tuned" not in ln(heuristic)["fallbacks"]["fwd"]
    choice = torch.ops.hfnn.layer_norm_default(torch.empty(16, 64, device="cuda"), [64], None, None, False)
    assert ln(heuristic)["calls"]["fwd"].get(choice, 0) >= 2, (choice, heuristic)


@requires_gpu
@pytest.mark.parametrize("mode", ["to_hfnn", "autocast", "graph"])
def test_on_the_gpu_to_hfnn_autocast_and_cuda_graphs_use_the_table(tmp_path, mode):
    db = tuned_db(tmp_path / "shapes.db", device="cuda")
    out, stats = train(db, device="cuda", steps=2, mode=mode)
    assert out.returncode == 0, out.stderr
    assert set(ln(stats)["calls"]["fwd"]) == {"fwd_block"} and set(ln(stats)["calls"]["bwd"]) == {"bwd_block"}, stats


@requires_gpu
def test_on_the_gpu_torch_compile_traces_through(tmp_path):
    db = tuned_db(tmp_path / "shapes.db", device="cuda")
    out, stats = train(db, device="cuda", steps=2, mode="compile")
    assert out.returncode == 0, out.stderr
    # Inductor generates its own LayerNorm: the compiled region never calls the table's kernels.
    assert ln(stats)["calls"]["fwd"].get("fwd_block", 0) == 0
