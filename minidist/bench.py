"""Benchmarks: a minidist technique against its torch-native equivalent, in one run.

The harness runs the two sides *interleaved* on the same world (A then B, then B then A,
...), each round timing a few steps after a barrier, and reports the median of the per-round
ratios, so drift in the machine's speed hits both sides alike. Each figure is printed as one
`name=value` line, easy to grep in CI logs and to paste into an issue.

Speed goals live here, never in tests: a timed assertion on a shared 2-core machine fails
for reasons that have nothing to do with the code. The benches themselves live in the lesson
packages (`@bench(name)` in `minidist/<lesson>/lesson.py`, found through `minidist.registry`).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from . import comm
from .registry import benches


@dataclass
class ABResult:
    seconds_a: list[float]  # per round, per step
    seconds_b: list[float]

    @property
    def ratio(self) -> float:
        """Median over rounds of A's step time divided by B's."""
        return statistics.median(a / b for a, b in zip(self.seconds_a, self.seconds_b))


def interleaved_ab(
    step_a: Callable[[], None], step_b: Callable[[], None], rounds: int, steps: int, warmup: int = 2
) -> ABResult:
    """Time `steps` calls of each side per round, alternating which side goes first.

    Call it on every rank of a world (the barriers keep ranks in step); the times are this
    rank's.
    """
    for _ in range(warmup):
        step_a()
        step_b()
    result = ABResult([], [])
    for r in range(rounds):
        order = [(step_a, result.seconds_a), (step_b, result.seconds_b)]
        for step, out in order if r % 2 == 0 else order[::-1]:
            if dist.is_initialized():
                comm.barrier()
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            out.append((time.perf_counter() - t0) / steps)
    return result


def matmul_flops(m: int, k: int, n: int, repeats: int = 8) -> float:
    """FLOP/s of one float32 [m, k] @ [k, n] matmul on this process's device and threads
    (the median of `repeats`, after one untimed call)."""
    from .runtime.device import rank_device

    a, b = (torch.randn(*shape, device=rank_device()) for shape in ((m, k), (k, n)))
    times = []
    for _ in range(repeats + 1):
        if a.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if a.is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 2 * m * k * n / sorted(times[1:])[repeats // 2]


def peak_flops(
    per_process: float, world_size: int, threads: int | None = None, on_gpu: bool = False
) -> float:
    """The world's peak FLOP/s from one process's measured matmul rate (`matmul_flops`, on
    `threads` intra-op threads, the default `torch.get_num_threads()`, as each rank runs).
    Each rank has its own GPU; on CPUs the ranks of one machine share its cores, so a machine
    gives at most `per_process / threads` per core, whatever the number of ranks on it
    (LOCAL_WORLD_SIZE under torchrun, else all of them)."""
    if on_gpu:
        return per_process * world_size
    threads = threads or torch.get_num_threads()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    machines = max(1, world_size // local)
    return machines * per_process / threads * min(cores or 1, local * threads)


def run_bench(name: str, world_size: int, rounds: int, steps: int, **sizes) -> int:
    registered = benches()
    if name not in registered:
        raise SystemExit(f"bench: unknown name {name!r}; choose one of {sorted(registered)}")
    doc = " ".join((registered[name].__doc__ or "").split("\n\n")[0].split())
    results = registered[name](world_size, rounds, steps, **sizes)
    print(f"# bench {name}: {doc}", file=sys.stderr)  # what the lines measure; stdout stays
    for key, value in results.items():
        print(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    return 0
