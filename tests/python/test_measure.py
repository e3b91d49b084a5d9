"""hfnn/_measure.py's wall timing, on the CPU with a stand-in for torch.cuda: the tune worker's
candidates are sampled in turn, one sample of each a round, so a host whose CPU speed drifts slows
them alike; a candidate that raises leaves the rounds, the others go on, and nothing of its frames
outlives the call; train_records answers in the worker's protocol."""
import gc
import itertools
import math
import types
import weakref

from hfnn._measure import train_records, wall_samples_in_turn

STANDIN = types.SimpleNamespace(cuda=types.SimpleNamespace(synchronize=lambda: None))


def recorder(log, name, fail_after=None):
    """call(i) that logs its name and raises on its (fail_after + 1)-th call."""
    calls = itertools.count(1)

    def call(i):
        n = next(calls)
        log.append(name)
        if fail_after is not None and n > fail_after:
            raise RuntimeError(f"{name} broke at call {n}")
    return call


def runs(log):
    return [(name, len(list(group))) for name, group in itertools.groupby(log)]


def test_samples_are_taken_in_turn_one_of_each_a_round():
    log = []
    samples, failed = wall_samples_in_turn(STANDIN, {n: recorder(log, n) for n in "abc"}, budget_s=0.0,
                                           min_samples=5, max_samples=9)
    assert not failed
    assert {n: len(s) for n, s in samples.items()} == {"a": 5, "b": 5, "c": 5}
    assert all(s > 0 for v in samples.values() for s in v)
    order = [name for name, _ in runs(log)]
    # each warmed up and calibrated in turn (4 calls), then 5 rounds of a, b, c
    assert order == list("abc") * 6, order
    calibration = runs(log)[:3]
    assert all(n == 4 for _, n in calibration), calibration


def test_the_budget_adds_rounds_up_to_max_samples():
    log = []
    samples, _ = wall_samples_in_turn(STANDIN, {n: recorder(log, n) for n in "ab"}, budget_s=60.0, min_samples=2,
                                      max_samples=6)
    assert {n: len(s) for n, s in samples.items()} == {"a": 6, "b": 6}


def test_a_candidate_that_raises_leaves_and_the_others_go_on():
    log = []
    calls = {"a": recorder(log, "a"), "broken": recorder(log, "broken", fail_after=0),
             "late": recorder(log, "late", fail_after=4 + 1), "c": recorder(log, "c")}
    samples, failed = wall_samples_in_turn(STANDIN, calls, budget_s=0.0, min_samples=4, max_samples=4)
    assert set(failed) == {"broken", "late"}
    assert "call 1" in str(failed["broken"])  # its first warm-up call
    assert set(samples) == {"a", "c"} and all(len(s) == 4 for s in samples.values())
    # "late" was calibrated (4 calls) and broke in its first sample (at least 3 calls a sample), in
    # the first round, between a's sample and c's: after it, the rounds are a and c only
    last_late = max(i for i, n in enumerate(log) if n == "late")
    assert set(log[last_late + 1:]) == {"a", "c"}
    # calibration: a, broken (its first call), late, c; then the rounds
    assert [name for name, _ in runs(log)] == ["a", "broken", "late", "c", "a", "late", "c"] + ["a", "c"] * 3


class Held:
    """Stands in for a tensor a failing call's frame holds."""


def test_a_candidate_that_raises_keeps_nothing_of_its_frames_alive():
    refs = []

    def broken(i):
        held = Held()
        refs.append(weakref.ref(held))
        raise RuntimeError("out of memory")

    gc.disable()  # what a reference cycle would keep, only the collector frees
    try:
        samples, failed = wall_samples_in_turn(STANDIN, {"ok": lambda i: None, "broken": broken}, budget_s=0.0,
                                               min_samples=2, max_samples=2)
        assert failed == {"broken": "out of memory"} and len(samples["ok"]) == 2
        assert refs and all(r() is None for r in refs)
    finally:
        gc.enable()


def test_train_records_answer_every_candidate_in_order():
    def broken(i):
        raise ValueError("a launch failed\nsecond line")

    names = ["torch", "nan", "broken_in_check", "broken_while_timed", "fast"]
    errors = {"torch": 1e-3, "nan": math.inf, "broken_while_timed": 0.0, "fast": 2e-3}
    calls = {"torch": lambda i: None, "nan": lambda i: None, "broken_while_timed": broken, "fast": lambda i: None}
    out = train_records(STANDIN, names, errors, calls, {"broken_in_check": "bad output"}, budget_s=0.0)
    assert [r["name"] for r in out] == names
    assert all(r["pass"] == "train" for r in out)
    by = {r["name"]: r for r in out}
    assert by["broken_in_check"] == {"pass": "train", "name": "broken_in_check", "ran": False, "error": "bad output"}
    assert by["broken_while_timed"]["ran"] is False and by["broken_while_timed"]["error"] == "a launch failed"
    assert by["torch"]["max_error"] == 1e-3 and by["nan"]["max_error"] is None
    for name in ("torch", "nan", "fast"):
        assert "ran" not in by[name] and 7 <= len(by[name]["samples_us"]) <= 31, by[name]


def test_bench_mha_takes_its_candidates_rounds_in_turn(monkeypatch):
    # bench/mha.py's interleaved_walls, as the GPU machine runs it, with torch.cuda.synchronize a no-op
    import importlib.util
    from pathlib import Path

    import torch

    spec = importlib.util.spec_from_file_location("bench_mha", Path(__file__).resolve().parents[2] / "bench" / "mha.py")
    mha = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mha)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    log = []

    class Out:
        def __init__(self, name):
            self.name = name

        def backward(self, grad):
            log.append(self.name + ".bwd")

    def candidate(name):
        def fn():
            log.append(name)
            return Out(name), None
        return fn

    walls = mha.interleaved_walls({"torch": candidate("torch"), "hfnn": candidate("hfnn")}, None, 1e-4, 3)
    assert set(walls) == {(n, b) for n in ("torch", "hfnn") for b in (False, True)}
    assert all(ms > 0 and cpu >= 0 for ms, cpu in walls.values())
    # calibration: each (candidate, pass) 4 steps; then 3 rounds of the four in the same order
    plan = ["torch", "torch+bwd", "hfnn", "hfnn+bwd"]
    steps = []
    for entry in log:  # a step is its forward, and its backward when timed with one
        if entry.endswith(".bwd"):
            steps[-1] += "+bwd"
        else:
            steps.append(entry)
    order = [name for name, _ in itertools.groupby(steps)]
    assert order == plan * 4, order
