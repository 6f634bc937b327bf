"""When did communication happen, relative to backward? The numbers behind the DDP timeline.

`step_timeline` runs one training step of a `BucketedDataParallel` model and returns the
start and end of backward and of every bucket's all-reduce (from the ledger). `overlap`
is the fraction of communication time that ran while backward was still computing: 1.0
means the all-reduces were entirely hidden, 0.0 means none were (naive DP).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import comm


@dataclass
class StepTimeline:
    """Times in seconds from the start of forward."""

    forward_end: float
    backward_end: float
    step_end: float
    comm: list[tuple[float, float, str, int]]  # (start, end, tag, payload bytes)

    @property
    def overlap(self) -> float:
        return overlap_fraction([(s, e) for s, e, _, _ in self.comm], self.backward_end)


def union_length(intervals: list[tuple[float, float]], until: float = float("inf")) -> float:
    """Total length of the union of intervals, counting only time before `until`."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        start, end = max(start, reach), min(end, until)
        if end > start:
            total += end - start
            reach = end
    return total


def overlap_fraction(intervals: list[tuple[float, float]], compute_end: float) -> float:
    """Share of the communication time (union of intervals) that ended before `compute_end`."""
    busy = union_length(intervals)
    return union_length(intervals, until=compute_end) / busy if busy > 0 else 0.0


def step_timeline(
    ddp, batch: tuple[torch.Tensor, torch.Tensor], loss_fn: Callable, optimizer
) -> StepTimeline:
    """One step of `ddp` (a BucketedDataParallel, or a naive one with `all_reduce_gradients`)."""
    x, y = batch
    optimizer.zero_grad()
    with comm.record() as ledger:
        t0 = time.perf_counter()
        loss = loss_fn(ddp(x), y)
        forward_end = time.perf_counter()
        loss.backward()
        if hasattr(ddp, "all_reduce_gradients"):
            backward_end = time.perf_counter()
            ddp.all_reduce_gradients()
        else:
            backward_end = ddp.last_backward_end
        optimizer.step()
        step_end = time.perf_counter()
    records = [
        (r.start - t0, (r.end if r.end is not None else step_end) - t0, r.tag, r.payload_bytes)
        for r in ledger.records
    ]
    return StepTimeline(forward_end - t0, backward_end - t0, step_end - t0, records)
