"""Bad arguments across the library: each refused with a message naming the argument and the
rule, before anything starts or changes (a bool is not an int here, NaN is not a number of
seconds); and a loss scaler that skips every step says why."""

import functools
import math
import os
import warnings

import pytest
import torch

import minidist
from minidist.embedding.hash_table import HashTable
from minidist.mixed_precision import DynamicLossScaler
from minidist.parameter_server.server import ShardServer
from minidist.pipeline import schedule


def never_runs():
    raise AssertionError("a world started despite bad arguments")


CASES = {
    "schedule virtual for 1f1b": (
        lambda: schedule("1f1b", 2, 4, virtual=3),
        "virtual=3 .* needs kind='interleaved'",
    ),
    "schedule 2.5 stages": (lambda: schedule("gpipe", 2.5, 4), r"stages=2\.5 must be an int"),
    "schedule microbatches '4'": (
        lambda: schedule("1f1b", 2, "4"),
        "microbatches='4' must be an int >= 1",
    ),
    "schedule bool stages": (lambda: schedule("1f1b", True, 4), "stages=True must be an int"),
    "hash table capacity True": (lambda: HashTable(capacity=True), "capacity=True must be an int"),
    "launch world_size True": (lambda: minidist.launch(never_runs, True), "world_size must be"),
    "launch timeout nan": (
        lambda: minidist.launch(never_runs, 2, timeout_s=math.nan),
        "timeout_s must be > 0 and finite",
    ),
    "launch timeout inf": (
        lambda: minidist.launch(never_runs, 2, timeout_s=math.inf),
        "timeout_s must be > 0 and finite",
    ),
    "scaler init_scale nan": (
        lambda: DynamicLossScaler(init_scale=math.nan),
        "init_scale=nan must be a finite number > 0",
    ),
    "scaler init_scale inf": (
        lambda: DynamicLossScaler(init_scale=math.inf),
        "init_scale=inf must be a finite number > 0",
    ),
    "scaler growth_interval True": (
        lambda: DynamicLossScaler(growth_interval=True),
        "growth_interval=True must be an int",
    ),
    "server staleness -1": (
        lambda: ShardServer(torch.zeros(4), [1], staleness=-1),
        "staleness=-1 must be an int >= 0",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_arguments_are_named(case):
    call, message = CASES[case]
    with pytest.raises(ValueError, match=message):
        call()


def test_a_scaler_that_skips_every_step_warns_once_naming_the_cause():
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scaler = DynamicLossScaler(init_scale=2.0**16, warn_after=5)
    nan_batch = torch.full((3,), math.nan)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(40):
            optimizer.zero_grad()
            scaler.scale((weight * nan_batch).sum()).backward()
            assert not scaler.step(optimizer)
            scaler.update()
    stuck = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(stuck) == 1 and "5 steps skipped in a row" in str(stuck[0].message)
    assert "NaN or inf in the input batch" in str(stuck[0].message)
    assert torch.equal(weight.detach(), torch.ones(3))  # every step skipped, as before


def test_a_world_past_the_file_limit_or_memory_is_refused_before_any_rank(monkeypatch):
    """Each rank of gloo's full mesh holds a socket to every peer, and at least RANK_BYTES
    of its own: a world past the process's file limit could not connect, one past memory
    cannot start (`launch(fn, 100000)` forked until the machine ran out of processes).
    Refused by arithmetic, before any process starts."""
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda which: (64, 64))
    with pytest.raises(ValueError, match=r"world_size=65 ranks .* \(ulimit -n 64\)"):
        minidist.launch(never_runs, 65)
    unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    monkeypatch.setattr(resource, "getrlimit", lambda which: unlimited)
    if os.path.exists("/proc/meminfo"):  # 76 TiB at 8 MiB a rank
        with pytest.raises(ValueError, match=r"world_size=10000000 local processes need at"):
            minidist.launch(never_runs, 10**7)
    assert minidist.launch(lambda: 1, 2) == [1, 1]  # a world within the limit still runs


async def an_async_fn():
    return 1


def a_generator_fn(x):
    yield x


LAUNCH_CASES = {
    "fn not callable": ((3, 2), {}, TypeError, "fn must be callable"),
    "fn async": ((an_async_fn, 2), {}, TypeError, "is an async function"),
    "fn generator (partial)": (
        (functools.partial(a_generator_fn, 1), 2),
        {},
        TypeError,
        "is a generator function",
    ),
    "start_method forkserver": (
        (never_runs, 2),
        {"start_method": "forkserver"},
        ValueError,
        "start_method must be 'fork', 'spawn' or None",
    ),
    "start_method unknown": (
        (never_runs, 2),
        {"start_method": "bogus"},
        ValueError,
        "start_method must be 'fork', 'spawn' or None .*got 'bogus'",
    ),
    **{
        f"threads_per_rank {bad!r}": (
            (never_runs, 2),
            {"threads_per_rank": bad},
            ValueError,
            "threads_per_rank must be None or an int from 1 to the",
        )
        for bad in (0, -1, 10**6, 2.5, "2", True)
    },
    "backend empty": ((never_runs, 2), {"backend": ""}, ValueError, "backend must be one of"),
    **{
        f"timeout_s {bad:g}": (
            (never_runs, 2),
            {"timeout_s": bad},
            ValueError,
            "timeout_s must be > 0 and finite, at most 604800",
        )
        for bad in (1e9, 1e308)
    },
}


@pytest.mark.parametrize("case", list(LAUNCH_CASES))
def test_bad_launch_arguments_are_refused_before_any_rank_starts(case, monkeypatch):
    """Each refused naming the argument and the rule, before a rank starts: before, a fn that
    cannot be called (or whose call returns a coroutine or generator), threads_per_rank 0 /
    -1 / 2.5 / True, backend '' and start_method 'forkserver' started a world that failed
    (or, for 0 and '', ran with the default); timeout_s=1e9 raised OverflowError once the
    ranks ran; start_method 'bogus' said only "cannot find context"."""
    from minidist.runtime import parent

    def no_world(*args, **kwargs):
        raise AssertionError("a world started despite bad arguments")

    monkeypatch.setattr(parent, "_run_world", no_world)
    args, kwargs, error, message = LAUNCH_CASES[case]
    with pytest.raises(error, match=message):
        minidist.launch(*args, **kwargs)
