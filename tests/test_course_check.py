"""The shared checker machinery: a learner's crash, hang or loop is a message, never a
traceback; catalogues of wrong answers share their world launches."""

import pytest
import torch
import torch.distributed as dist

import minidist.course.catalogue as catalogue
from minidist import comm
from minidist.course.check import (
    COLLECTIVE_HINT,
    CheckFailed,
    LearnerFailed,
    Mistake,
    bounded,
    call_learner,
    catalogue_messages,
    diagnose_values,
    names_mistake,
    parse_traceback,
    run_on_world,
)
from minidist.runtime import RankFailedError

RECORDED = """Traceback (most recent call last):
  File "/x/minidist/runtime/rank.py", line 59, in _rank_main
    message = ("ok", fn(*args, **kwargs), time.time())
  File "/x/minidist/zero/check/shard_with_padding.py", line 40, in _shard_rank
    got = fn(t, rank, world)
  File "/tmp/ipykernel_81/2212.py", line 4, in shard_with_padding
    return chunks[rank]
           ~~~~~~^^^^^^
IndexError: tuple index out of range
"""


def test_recorded_traceback_names_the_learner_line():
    failure = parse_traceback(RECORDED.replace("/x/minidist", str(catalogue.__file__)[:-21]))
    assert failure.kind == "IndexError"
    assert failure.message == "tuple index out of range"
    assert failure.source == "return chunks[rank]"
    assert "`shard_with_padding` (a notebook cell, line 4)" in failure.where


def _off_by_one(xs):
    return xs[len(xs)]


def _forever(x):
    while True:
        x += 1


def test_in_process_exception_and_endless_loop_are_messages():
    with pytest.raises(LearnerFailed, match=r"IndexError.*`_off_by_one`.*xs\[len\(xs\)\].*off-by"):
        call_learner(_off_by_one, [1, 2])
    with pytest.raises(LearnerFailed, match="still running after 0.5 s.*never ends"):
        call_learner(_forever, 0, timeout_s=0.5)
    with pytest.raises(LearnerFailed, match="Likely cause: the bucket is full"):
        call_learner(_off_by_one, [], hints={"IndexError": "the bucket is full"})


def _search_forever(step):
    slot = 0
    while slot != 1:  # a probe step that never reaches slot 1
        slot = (slot + step) % 4
    return "found"


def test_a_diagnosis_is_bounded():
    assert bounded(1.0, _search_forever, 1) == "found"
    message = bounded(0.5, _search_forever, 2)
    assert "(_search_forever) did not finish in 0.5 s" in message


def _apply(fn):
    return fn(torch.arange(3.0))


def _raises_own_error(x):
    if dist.get_rank() == 1:
        raise ValueError("capacity exceeded")
    return x


def _collective_on_rank0_only(x):
    if dist.get_rank() == 0:
        comm.all_reduce(x)
    return x


def _own_sizes(x):
    comm.all_reduce(torch.ones(3 + dist.get_rank()))
    return x


def _hangs(x):
    comm.recv(x, src=1 - dist.get_rank())  # both ranks receive, neither sends
    return x


def test_world_failures_are_messages_naming_rank_and_cause():
    with pytest.raises(LearnerFailed, match=r"rank 1: your code raised ValueError: capacity ") as e:
        run_on_world(_apply, 2, _raises_own_error, hints={"capacity": "one slot short"})
    assert isinstance(e.value, RankFailedError) and e.value.rank == 1  # checkers may refine
    assert "one slot short" in str(e.value) and "Traceback" not in str(e.value)
    for wrong in (_collective_on_rank0_only, _own_sizes):
        with pytest.raises(CheckFailed, match=r"rank \d failed first, inside a collective") as e:
            run_on_world(_apply, 2, wrong)
        assert COLLECTIVE_HINT in str(e.value) and "Traceback" not in str(e.value)
    hang = r"still waiting after 3 s in which none of them used the CPU.*same collectives.*hint!"
    with pytest.raises(CheckFailed, match=hang):
        run_on_world(_apply, 2, _hangs, hang_hint="hint!")


def _spins_on_rank_one(x):
    while dist.get_rank() == 1:
        x += 1
    comm.all_reduce(x)
    return x


def test_a_world_is_stopped_by_the_limit_it_broke_and_says_which():
    """A rank computing past the CPU limit is named, the others waiting for it as well; with
    no CPU times to read, the limit is the clock's and the message says either cause."""
    with pytest.raises(
        CheckFailed, match=r"rank 1 was still running after 1 s of CPU time.*never ends"
    ):
        run_on_world(_apply, 2, _spins_on_rank_one, timeout_s=1)


def test_without_cpu_times_a_checkers_world_stops_by_the_clock(monkeypatch):
    import minidist.runtime.collect as collect

    monkeypatch.setattr(collect, "_cpu_s", lambda pid: None)
    with pytest.raises(CheckFailed, match=r"still waiting after 1 s \(.*, or a loop never ends"):
        run_on_world(_apply, 2, _hangs, timeout_s=1)


def test_in_process_limits_are_cpu_time_with_the_clock_behind(monkeypatch):
    """Waiting uses no CPU time: a 1 s sleep passes a 0.3 s limit; the clock's limit (here
    made 0.5 s) stops code that only waits, and says so."""
    import time

    import minidist.course.failures as failures

    call_learner(time.sleep, 1.0, timeout_s=0.3)
    monkeypatch.setattr(failures, "WALL_MIN_S", 0.5)
    monkeypatch.setattr(failures, "WALL_FACTOR", 1)
    with pytest.raises(LearnerFailed, match=r"after 0.5 s by the clock.*waiting for something"):
        call_learner(time.sleep, 30.0, timeout_s=0.2)


def _right(x):
    return x * 2


def _twice(x):
    return x * 4


def _check(fn):
    for world in (2, 3):
        for rank, out in enumerate(run_on_world(_apply, world, fn)):
            if not torch.equal(out, torch.arange(3.0) * 2):
                raise CheckFailed(f"on {world} ranks rank {rank} returned {out.tolist()}")


CATALOGUE = [
    Mistake("right", (_right,), ""),
    Mistake("twice", (_twice,), r"on 2 ranks rank 0 returned \[0.0, 4.0, 8.0\]"),
    Mistake("own error", (_raises_own_error,), "rank 1: your code raised ValueError"),
    Mistake("rank 0 only", (_collective_on_rank0_only,), "same collectives", alone=True),
]


def test_catalogue_shares_world_launches(monkeypatch):
    launches = []
    real = catalogue.launch
    monkeypatch.setattr(catalogue, "launch", lambda *a, **k: launches.append(a[1]) or real(*a, **k))
    messages = catalogue_messages(_check, CATALOGUE)
    assert messages["right"] is None
    for m in CATALOGUE[1:]:
        assert names_mistake(m, messages[m.name]) is None
    # one world of 2 and one of 3 for the three shared answers; the lone one fails on 2
    assert launches == [2, 3, 2]
    assert "passed this wrong answer" in names_mistake(CATALOGUE[1], None)


def test_diverging_answer_in_a_shared_world_falls_back(monkeypatch):
    launches = []
    real = catalogue.launch
    monkeypatch.setattr(catalogue, "launch", lambda *a, **k: launches.append(a[1]) or real(*a, **k))
    lone = CATALOGUE[3]
    messages = catalogue_messages(_check, [Mistake(lone.name, lone.answer, ""), CATALOGUE[1]])
    assert COLLECTIVE_HINT in messages[lone.name]
    assert "returned [0.0, 4.0, 8.0]" in messages["twice"]
    assert launches[0] == 2 and len(launches) == 3  # the batch, then each answer alone


def test_fallback_names_the_quantity_where_and_by_how_much():
    local = {"w": torch.tensor([1.0, 2.0, 3.0]), "b": torch.tensor([1.0])}
    ref = {"w": torch.tensor([1.5, 2.5, 3.5]), "b": torch.tensor([2.0])}
    got = {"w": torch.tensor([1.5, 9.0, 3.5]), "b": torch.tensor([2.0])}
    message = diagnose_values(got, ref, local, world=2)
    assert "['w'] differ" in message and "not by a uniform factor" in message
    assert "1 of 3 elements differ, the first at flat index 1 (got 9, expected 2.5)" in message
    # the families come first: a uniform N/(N-1) is named as such
    third = {n: t * 3 / 2 for n, t in ref.items()}
    assert "divided the sum over 3 ranks by N-1 = 2" in diagnose_values(third, ref, local, 3)


def test_an_outer_timer_due_first_still_fires_on_time():
    """An outer timer (pytest-timeout's, the grader's) due before the clock's limit: the
    learner's code is stopped then, and the outer handler still runs, not a minute late."""
    import signal
    import time

    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *a: fired.append(time.monotonic()))
    t0 = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(LearnerFailed, match=r"after 0.5 s by the clock"):
            call_learner(time.sleep, 5.0, timeout_s=2)
        time.sleep(0.2)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert fired and fired[0] - t0 < 2
