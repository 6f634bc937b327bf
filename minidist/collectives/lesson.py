"""Lesson 00's entry in the tour: the ring all-reduce against the library's all-reduce."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from .. import comm
from ..registry import TourRow, tour_row
from ..runtime import launch, rank_device
from . import theory
from .ring import ring_all_reduce

# float32 sums in the ring's order vs gloo's: a few ulps of values ~ N.
TOUR_TOL = 1e-5


def _ring_rank(numel: int):
    g = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(numel, device="cpu", generator=g).to(rank_device())
    expected = x.clone()
    comm.all_reduce(expected)
    with comm.record() as ledger:
        ring_all_reduce(x)
    return float((x - expected).abs().max()), ledger.total_ring_bytes()


@tour_row("ring all-reduce", lesson=0)
def ring_row(world_size: int, out_dir: Path) -> TourRow:
    numel = 4096 * world_size
    results = launch(_ring_rank, world_size, numel)
    diff = max(d for d, _ in results)
    return TourRow(
        "ring all-reduce",
        diff < TOUR_TOL,
        diff,
        None,
        None,
        bytes_per_rank=results[0][1],
        bytes_theory=theory.ring_all_reduce_bytes(numel, world_size),
    )
