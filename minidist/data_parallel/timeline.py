"""When did communication happen, relative to backward? The numbers behind the DDP timeline.

`step_timeline` runs one training step of any `ParallelModule` and returns the end of
forward, the end of backward's computation (the last gradient a parameter received, read
from post-accumulate-grad hooks of its own), the end of the step, and every collective
(from the ledger). `overlap` is the fraction of communication time that ran while backward
was still computing: 1.0 means the all-reduces were entirely hidden, 0.0 means none were
(naive DP). Li et al. 2020, "PyTorch Distributed", section 3.2.3 (overlapping computation
with communication).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import comm
from ..parallel import ParallelModule


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
    model: ParallelModule,
    batch: tuple[torch.Tensor, torch.Tensor],
    loss_fn: Callable,
    optimizer: torch.optim.Optimizer,
) -> StepTimeline:
    """One step of `model`: forward, backward, `finish_gradient_sync()`, optimizer step."""
    x, y = batch
    last_grad = [0.0]

    def stamp(_param: torch.Tensor) -> None:
        last_grad[0] = time.perf_counter()

    # Registered after the wrapper's own hooks, so each fires once the wrapper's has run.
    handles = [
        p.register_post_accumulate_grad_hook(stamp) for p in model.parameters() if p.requires_grad
    ]
    try:
        optimizer.zero_grad()
        with comm.record() as ledger:
            t0 = time.perf_counter()
            loss = loss_fn(model(x), y)
            forward_end = time.perf_counter()
            loss.backward()
            model.finish_gradient_sync()
            optimizer.step()
            step_end = time.perf_counter()
    finally:
        for h in handles:
            h.remove()
    records = [
        (r.start - t0, (r.end if r.end is not None else step_end) - t0, r.tag, r.payload_bytes)
        for r in ledger.records
    ]
    return StepTimeline(forward_end - t0, last_grad[0] - t0, step_end - t0, records)
