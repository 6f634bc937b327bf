"""When did the K/V blocks travel, relative to the attention computed on them?

`ring_timeline_rank` runs one ring-attention forward and backward on a rank and returns
what `ring.py` noted meanwhile: each step's computation and each transfer, from the post of
its send and receive to the end of its wait. `overlap` is the share of the transfers' time
during which this rank was computing: the point of ring attention (Liu et al. 2023,
section 3, "fully overlapping the communication"). Lesson 01's DDP timeline
(`data_parallel/timeline.py`) measures the all-reduces against backward the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from . import ring
from .split import positions


@dataclass
class RingTimeline:
    """Times in seconds from the start of forward: (what, start, end), `what` being
    "compute" or a transfer's tag ("cp-kv-forward", "cp-kv-backward", "cp-dkv-backward")."""

    events: list[tuple[str, float, float]]
    forward_end: float

    def spans(self, transfers: bool) -> list[tuple[float, float]]:
        return [(s, e) for what, s, e in self.events if (what != "compute") == transfers]

    @property
    def overlap(self) -> float:
        """Share of the K/V blocks' transfer time that ran while this rank computed."""
        kv = [(s, e) for what, s, e in self.events if what.startswith("cp-kv")]
        busy = _union(kv)
        return _union(_intersect(kv, self.spans(transfers=False))) / busy if busy else 0.0


def _union(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        start = max(start, reach)
        if end > start:
            total, reach = total + end - start, end
    return total


def _intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]):
    return [(max(s, t), min(e, f)) for s, e in a for t, f in b if min(e, f) > max(s, t)]


def ring_timeline_rank(
    layout: str = "zigzag", batch: int = 1, heads: int = 4, seq: int = 2048, dim: int = 64
) -> RingTimeline:
    """On a rank: one forward and backward of ring attention (float32) over the whole world,
    with the steps' computation and transfers noted; times from the start of forward."""
    c, r = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(0)
    pos = positions(seq, c, r, layout)
    q, k, v = (
        torch.randn(batch, heads, seq, dim, device="cpu", generator=g)[:, :, pos].requires_grad_()
        for _ in "qkv"
    )
    ring._EVENTS = []
    try:
        t0 = time.perf_counter()
        out = ring.ring_attention(q, k, v, None, layout)
        forward_end = time.perf_counter()
        out.sum().backward()
        events = [(what, s - t0, e - t0) for what, s, e in ring._EVENTS]
    finally:
        ring._EVENTS = None
    ring.work_per_forward()  # this forward's pair count is not the lesson's
    return RingTimeline(events, forward_end - t0)
