"""hfnn/_measure.py's wall timing, on the CPU with a stand-in for torch.cuda: the tune worker's
candidates are sampled in turn, one sample of each a round, so a host whose CPU speed drifts slows
them alike; a candidate that raises leaves the rounds and the others go on."""
import itertools
import types

from hfnn._measure import wall_samples_in_turn

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
