"""nn.MultiheadAttention through the whole chain (issue 11): `hfnn profile` records its keys, `hfnn
tune` measures torch's module and every core (tune worker: hfnn/_families/multihead_attention.py),
HFNN_DISPATCH_DB runs each tuned key's winner (the C++ op hfnn::multi_head_attention_dispatch,
reached through a wrapper of nn.MultiheadAttention.forward) and counts calls per core and fall-backs
per reason in hfnn.dispatch_stats(). On the CPU the tables come from the stand-in tune worker
(tests/python/scripts/fake_tune_worker.py) naming a real core; on a GPU the real worker tunes."""
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import hfnn
from conftest import requires_gpu

HFNN = shutil.which("hfnn")
SCRIPTS = Path(__file__).parent / "scripts"
TRAIN = SCRIPTS / "mha_train.py"
pytestmark = pytest.mark.skipif(HFNN is None, reason="the hfnn executable is not on PATH: run scripts/setup.sh")
# Per step, mha_train.py makes 2 causal self-attention calls, 1 cross-attention call, 1 with
# need_weights=True and 1 with a padding mask, which the op takes, and 1 with add_bias_kv, which it does not.
TAKEN, STEPS = 5, 3
SETTINGS = "module settings the op does not take"


def run(*args, timeout=240, **env):
    e = dict(os.environ, **env)
    for k in ("HFNN_PROFILE_DIR", "HFNN_DISPATCH_DB"):
        if k not in env:
            e.pop(k, None)
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, env=e)


def profile(db, device):
    out = run(HFNN, "profile", "-q", "--db", str(db), "--python", sys.executable, str(TRAIN), device, "4")
    assert out.returncode == 0, out.stderr
    return db


def fake_tune(db, winner, gpu=False, **env):
    """`hfnn tune` with the stand-in worker: `winner` (a core, or "torch" by timing the core slower)
    wins every attention key, for this machine's versions (and its GPU, with gpu=True)."""
    e = dict(HFNN_TUNE_WORKER=str(SCRIPTS / "fake_tune_worker.py"), FAKE_TUNE_TORCH=torch.__version__,
             FAKE_TUNE_CUDA=torch.version.cuda or "", FAKE_TUNE_HFNN=hfnn.__version__,
             FAKE_TUNE_WINNER_TRAIN="sdpa_math" if winner == "torch" else winner,
             FAKE_TUNE_GOOD_US="200" if winner == "torch" else "50", **env)
    if gpu:
        props = torch.cuda.get_device_properties(0)
        e.update(FAKE_TUNE_GPU=props.name, FAKE_TUNE_CC=f"{props.major}.{props.minor}",
                 FAKE_TUNE_SMS=str(props.multi_processor_count))
    out = run(HFNN, "tune", "-q", "--db", str(db), "--python", sys.executable, **e)
    assert out.returncode == 0, out.stderr
    return db


def train(device, db=None, mode="", **env):
    if db is not None:
        env["HFNN_DISPATCH_DB"] = str(db)
    out = run(sys.executable, str(TRAIN), device, str(STEPS), mode, **env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def mha(stats):
    return stats["ops"]["multihead_attention"]


@pytest.fixture(scope="module")
def cpu_db(tmp_path_factory):
    return fake_tune(profile(tmp_path_factory.mktemp("mha") / "shapes.db", "cpu"), "sdpa_efficient")


def test_tune_lists_attention_keys_with_their_settings(cpu_db):
    keys = sqlite3.connect(cpu_db).execute(
        "SELECT key, dtype, pass, winner FROM tune_winners WHERE op = 'multihead_attention' ORDER BY key").fetchall()
    assert keys == [
        ("B=4,L=16,S=16,E=32,H=4,batch_first=1,causal=0,inputs=self,bias=1,dropout=0,key_padding_mask=bool",
         "float32", "train", "sdpa_efficient"),
        ("B=4,L=16,S=16,E=32,H=4,batch_first=1,causal=0,inputs=self,bias=1,dropout=0,weights=mean", "float32",
         "train", "sdpa_efficient"),
        ("B=4,L=16,S=16,E=32,H=4,batch_first=1,causal=1,inputs=self,bias=1,dropout=0", "float32", "train",
         "sdpa_efficient"),
        ("B=4,L=16,S=24,E=32,H=4,batch_first=0,causal=0,inputs=kv,bias=1,dropout=0", "float32", "train",
         "sdpa_efficient"),
    ]  # add_bias_kv has no key; the padding mask and need_weights=True are keys of their own
    out = run(HFNN, "tune", "--dry-run", "--force", "--db", str(cpu_db))
    assert out.returncode == 0, out.stderr
    assert "4 MultiheadAttention key(s)" in out.stdout and "4 x 16 (kv 24), 32/4 cross seq-first" in out.stdout
    assert "4 x 16, 32/4 pad(bool)" in out.stdout and "4 x 16, 32/4 weights(mean)" in out.stdout
    assert "no variants for multihead_attention" not in out.stdout
    report = run(HFNN, "report", "--db", str(cpu_db))
    assert report.returncode == 0, report.stderr
    assert "MultiheadAttention 4 x 16, 32/4 causal" in report.stdout and "sdpa_efficient" in report.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the real worker tunes")
def test_tune_on_a_machine_without_a_gpu_says_so(tmp_path):
    db = profile(tmp_path / "shapes.db", "cpu")
    out = run(HFNN, "tune", "--db", str(db), "--python", sys.executable)
    assert out.returncode == 1 and "no CUDA device" in out.stderr and "Traceback" not in out.stderr
    assert sqlite3.connect(db).execute("SELECT count(*) FROM tune_winners").fetchone() == (0,)


def test_dispatch_counts_every_attention_call_and_changes_nothing_on_the_cpu(cpu_db):
    plain, _ = train("cpu")
    tuned, err = train("cpu", cpu_db, HFNN_VERBOSE="1")
    assert tuned["wrapped"] and not plain["wrapped"]
    assert tuned["losses"] == plain["losses"]  # torch's module ran every call
    m = mha(tuned["stats"])
    assert m["keys"] == 4
    assert m["calls"]["train"] == {"torch": (TAKEN + 1) * STEPS}
    assert m["fallbacks"]["train"] == {"CPU tensor": TAKEN * STEPS, SETTINGS: STEPS}
    assert "MultiheadAttention forward + backward: 18 calls" in err and "torch because CPU tensor: 15" in err


def test_hfnn_modules_keep_their_op_under_dispatch(cpu_db):
    plain, _ = train("cpu", mode="to_hfnn")
    tuned, _ = train("cpu", cpu_db, mode="to_hfnn")
    assert tuned["hfnn_calls"] == plain["hfnn_calls"] == {"hfnn": TAKEN * STEPS}
    assert tuned["losses"] == plain["losses"]
    # hfnn's module asks the table for every call (a CPU call: counted, then torch's pick of core in
    # hfnn's op; add_bias_kv: counted with its reason, as plain modules' are), and its fall-backs
    # reach torch's own forward, not the wrapper (no call counted twice).
    m = mha(tuned["stats"])
    assert m["fallbacks"]["train"] == {"CPU tensor": TAKEN * STEPS, SETTINGS: STEPS}
    assert m["calls"]["train"] == {"torch": (TAKEN + 1) * STEPS}
    # hfnn.nn.attention_fallbacks: the same either way, with dispatch_stats()'s reasons.
    assert tuned["hfnn_fallbacks"] == plain["hfnn_fallbacks"] == {SETTINGS: STEPS}
    assert not mha(plain["stats"])["calls"]["train"]  # without a table nothing is counted there


def test_a_table_without_attention_keys_leaves_the_module_alone(tmp_path):
    db = tmp_path / "ln_only.db"
    subprocess.run([HFNN, "profile", "-q", "--db", str(db), "--python", sys.executable,
                    str(SCRIPTS / "tiny_train.py"), "3"], check=True, capture_output=True, timeout=120)
    fake_tune(db, "fwd_block")
    tuned, _ = train("cpu", db)
    assert not tuned["wrapped"]
    assert mha(tuned["stats"])["calls"]["train"] == {}


def test_the_dispatch_op_names_every_reason(cpu_db):
    """The C++ router itself, in this process (no table loaded: CPU calls)."""
    m = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(2, 3, 8)
    route = torch.ops.hfnn.multi_head_attention_dispatch
    args = (x, x, x, 2, m.in_proj_weight, m.in_proj_bias, m.out_proj.weight, m.out_proj.bias, True)
    torch.ops.hfnn.dispatch_reset_counts()

    def torch_runs(*a, **kw):
        out, weights, why = route(*a, **kw)
        assert out is None and weights is None and why
        return why

    assert torch_runs(*args, False, 0.0, False, None, torch.zeros(3, 3, dtype=torch.float64), False, False) == \
        "mask the op does not take"  # a float mask of another dtype
    # Masks torch's module rejects: it runs, to raise its own error (not counted: no call runs).
    assert torch_runs(*args, False, 0.0, False, None, torch.zeros(4, 3, dtype=torch.bool), False, False) == \
        "mask the op does not take"
    assert torch_runs(*args, True, 0.0, False, None, None, False, False) == "mask the op does not take"  # likewise
    assert torch_runs(*args, False, 0.0, False, None, torch.zeros(3, 3, requires_grad=True), False, False) == \
        "mask requires grad"
    assert torch_runs(*args, False, 0.0, False, None, None, True, False) == "module settings the op does not take"
    assert torch_runs(x, x, x, 2, None, None, m.out_proj.weight, m.out_proj.bias, True, False, 0.0, False, None,
                      None, False, False) == "input no variant takes"  # no projection weights
    assert torch_runs(x[0], x[0], x[0], 2, *args[4:], False, 0.0, False, None, None, False, False) == "unbatched input"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors are a prototype
        nested = torch.nested.nested_tensor([torch.randn(3, 8), torch.randn(2, 8)])
    assert torch_runs(nested, nested, nested, 2, *args[4:], False, 0.0, False, None, None, False, False) == \
        "nested tensor"
    assert torch_runs(*args, False, 0.0, False, None, None, False, False) == "CPU tensor"  # CPU: torch's module
    # hfnn's module: the op with torch's pick, weights too; for invalid masks torch's forward (its error).
    y, w, why = route(*args, False, 0.0, False, None, None, False, True)
    torch.testing.assert_close(y, m(x, x, x, need_weights=False)[0])
    assert w is None and why == ""
    y, w, _ = route(*args, False, 0.0, True, None, None, False, True, False)
    y_ref, w_ref = m(x, x, x, average_attn_weights=False)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(w, w_ref)
    assert torch_runs(*args, False, 0.0, False, None, torch.zeros(4, 3, dtype=torch.bool), False, True) == \
        "mask the op does not take"
    # count=False (hfnn's module without a table): nothing counted, the reason returned.
    assert torch_runs(*args, False, 0.0, False, None, None, True, True, count=False) == \
        "module settings the op does not take"
    assert route(*args, False, 0.0, False, None, None, False, True, count=False)[0] is not None
    fallbacks = mha(hfnn.dispatch_stats())["fallbacks"]["train"]
    assert fallbacks == {"mask the op does not take": 1, "mask requires grad": 1,
                         "module settings the op does not take": 1, "input no variant takes": 1,
                         "unbatched input": 1, "nested tensor": 1, "CPU tensor": 3}


# ---- on a GPU -----------------------------------------------------------------------------------------

@requires_gpu
@pytest.mark.parametrize("key", [
    "B=4,L=64,S=64,E=128,H=4,batch_first=1,causal=1,inputs=self,bias=1,dropout=0",
    "B=3,L=40,S=72,E=96,H=3,batch_first=0,causal=0,inputs=kv,bias=0,dropout=0",
    "B=2,L=33,S=17,E=64,H=8,batch_first=1,causal=0,inputs=qkv,bias=1,dropout=1",
    "B=4,L=64,S=64,E=128,H=4,batch_first=1,causal=0,inputs=self,bias=1,dropout=0,key_padding_mask=bool",
    "B=3,L=40,S=72,E=128,H=2,batch_first=0,causal=0,inputs=kv,bias=1,dropout=1,key_padding_mask=float,"
    "attn_mask=bool3d",
    "B=2,L=33,S=17,E=64,H=4,batch_first=1,causal=0,inputs=qkv,bias=0,dropout=0,attn_mask=float2d",
    "B=4,L=32,S=32,E=128,H=4,batch_first=1,causal=0,inputs=self,bias=1,dropout=0,attn_mask=bool2d,weights=mean",
    "B=2,L=24,S=40,E=64,H=2,batch_first=1,causal=0,inputs=qkv,bias=1,dropout=0,weights=per_head",
    "B=3,L=48,S=56,E=128,H=4,batch_first=1,causal=0,inputs=qkv,bias=1,dropout=0,key_padding_mask=bool,"
    "kdim=96,vdim=64",
])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_measure_times_every_core_and_the_gate_rejects_the_planted_one(key, dtype):
    from hfnn._families import multihead_attention as fam

    tol = {"float32": 2e-3, "bfloat16": 3e-2}[dtype]  # kernels/multihead_attention's tolerance
    r = fam.measure(torch, hfnn, {"key": key, "dtype": dtype, "passes": ["train"], "seconds": 1.0},
                    torch.cuda.get_device_properties(0).L2_cache_size, plant=True)
    by = {c["name"]: c for c in r["candidates"]}
    assert "torch" in by and "planted_wrong" in by
    for name, c in by.items():
        assert c.get("ran", True), (name, c)
        assert len(c["samples_us"]) >= 7 and min(c["samples_us"]) > 0, name
        assert c["pass"] == "train"
    torch_err = by["torch"]["max_error"]
    cores = [n for n in by if n.startswith("sdpa_")]
    if "weights=" in key:
        assert cores == ["sdpa_math"], cores  # only the math composite returns the weights
    else:  # math takes everything; a fused core takes these (efficient where a mask applies)
        assert "sdpa_math" in cores and len(cores) >= 2, cores
    if "mask=" in key:
        assert "sdpa_flash" not in cores and "sdpa_cudnn" not in cores, cores
    for n in cores + ["torch"]:
        assert by[n]["max_error"] <= max(tol, 2 * torch_err), (n, by[n]["max_error"])
    assert by["planted_wrong"]["max_error"] > max(tol, 2 * torch_err)  # what the tuner's gate rejects


@requires_gpu
def test_dispatch_runs_the_stored_core_on_the_gpu(tmp_path):
    db = fake_tune(profile(tmp_path / "shapes.db", "cuda"), "sdpa_efficient", gpu=True)
    plain, _ = train("cuda")
    tuned, _ = train("cuda", db)
    m = mha(tuned["stats"])
    # The stand-in worker made sdpa_efficient the winner of every key, the need_weights key's too,
    # which that core refuses (only the math composite returns the weights): torch's module runs it.
    assert m["calls"]["train"] == {"sdpa_efficient": (TAKEN - 1) * STEPS, "torch": 2 * STEPS}
    assert m["fallbacks"]["train"] == {"winner refused the input": STEPS, SETTINGS: STEPS}
    for a, b in zip(tuned["losses"], plain["losses"]):
        assert abs(a - b) <= 1e-4 * abs(b), (tuned["losses"], plain["losses"])
    torch_won = fake_tune(profile(tmp_path / "torch.db", "cuda"), "torch", gpu=True)
    tuned, _ = train("cuda", torch_won)
    assert mha(tuned["stats"])["fallbacks"]["train"]["torch won the tuning"] == TAKEN * STEPS
    assert tuned["losses"] == plain["losses"]


@requires_gpu
def test_profile_tune_dispatch_end_to_end_on_the_gpu(tmp_path):
    """The real chain: profile, tune with the real worker (every core timed and gated), then train
    under HFNN_DISPATCH_DB: each key's calls ran its stored winner, and the losses match torch's."""
    db = profile(tmp_path / "shapes.db", "cuda")
    out = run(HFNN, "tune", "--db", str(db), "--python", sys.executable, "--seconds-per-key", "1",
              HFNN_TUNE_PLANT_WRONG="1")
    assert out.returncode == 0, out.stderr
    con = sqlite3.connect(db)
    winners = dict(con.execute("SELECT key, winner FROM tune_winners WHERE op = 'multihead_attention'").fetchall())
    assert len(winners) == 4 and "planted_wrong" not in winners.values()
    assert con.execute("SELECT count(*) FROM tune_results WHERE candidate = 'planted_wrong' AND accepted = 1"
                       ).fetchone() == (0,)
    plain, _ = train("cuda")
    tuned, _ = train("cuda", db)
    calls = mha(tuned["stats"])["calls"]["train"]
    # Per step the causal key runs twice, the other keys once; the add_bias_kv call is torch's.
    expected = {}
    for key, winner in winners.items():
        n = (2 if "causal=1" in key else 1) * STEPS
        expected[winner] = expected.get(winner, 0) + n
    expected["torch"] = expected.get("torch", 0) + STEPS
    assert calls == expected, (calls, winners)
    for a, b in zip(tuned["losses"], plain["losses"]):
        assert abs(a - b) <= 1e-4 * abs(b), (tuned["losses"], plain["losses"])
