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

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

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


def run_bench(name: str, world_size: int, rounds: int, steps: int) -> int:
    registered = benches()
    if name not in registered:
        raise SystemExit(f"bench: unknown name {name!r}; choose one of {sorted(registered)}")
    doc = " ".join((registered[name].__doc__ or "").split("\n\n")[0].split())
    print(f"# bench {name}: {doc}", file=sys.stderr)  # what the lines measure; stdout stays
    for key, value in registered[name](world_size, rounds, steps).items():
        print(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    return 0
