"""Lesson 03's entries in the tour: FSDP (ZeRO-3) and hybrid sharding against one process.

Both rows train lesson 01's GPT (one unit per block, the root holding embeddings, tied head
and final norm) with Adam, compare with the same model trained in one process
(`minidist.zero.fixture.reference`), measure one rank's model state against
`theory.sharded_state_bytes` (plus the frozen parameter, kept whole) and its bytes sent
per step against `theory.bytes_sent_per_step`, and save the unit timeline of one more step.
The `zero` bench (FSDP and ZeRO-1 against torch's) lives in `bench.py`, imported here so that
the registry finds it.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from .. import comm
from ..data import shard_batch
from ..data_parallel.fixture import build
from ..registry import TourRow, tour_row
from ..runtime import launch
from ..training import max_abs_diff, train
from ..zero.fixture import ADAM, build_args, reference
from . import bench, theory  # noqa: F401 (importing bench registers its `zero` bench)
from .fixture import UNITS, fsdp_state_bytes
from .fully_sharded import FullyShardedDataParallel
from .timeline import record_step

MODEL = "gpt"
# As tests/test_fsdp.py: gradients agree within float32 summation order (1e-6); Adam's ±lr
# steps keep a near-cancelling gradient's relative error, so parameters within 1e-4 after
# 5 steps at lr = 1e-2 (a missed or doubled gradient moves a parameter by ~lr).
GRAD_TOL, PARAM_TOL = 1e-6, 1e-4
# The comparison contract's gathers (`full_grads()` every step, `full_parameters()` at the
# end): a check, not training traffic.
CONTRACT_TAG = "full-state"


def hybrid_shard_size(world_size: int) -> int:
    """F for the hybrid row: the smallest divisor of N between 1 and N (2 on an even world of
    4 or more: shard over pairs, replicate across the N/2 pairs); N where there is none (N
    prime or 1), which is plain FSDP."""
    return next((f for f in range(2, world_size) if world_size % f == 0), world_size)


def training_bytes_per_step(ledger: comm.Ledger, steps: int) -> float:
    """Bytes this rank sent per training step (ring model), the contract's gathers left out."""
    return sum(r.ring_bytes for r in ledger.records if r.tag != CONTRACT_TAG) / steps


def _tour_rank(**options):
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build(MODEL, **build_args(MODEL))
    fsdp = FullyShardedDataParallel(model, wrap=UNITS[MODEL], **options)
    opt = torch.optim.Adam(fsdp.sharded_parameters(), **ADAM)
    local = [shard_batch(b, rank, world) for b in batches]
    with comm.record() as ledger:
        trace = train(fsdp, local, loss_fn, opt)
    memory = fsdp_state_bytes(fsdp, opt)
    timeline = record_step(fsdp, local[0], loss_fn, opt)  # one more step, after measuring
    numels = [u.numel for u in fsdp.units]
    return trace, training_bytes_per_step(ledger, len(batches)), memory.total, numels, timeline


def _fsdp_row(label: str, world_size: int, out_dir: Path, shard_size: int) -> TourRow:
    import matplotlib.pyplot as plt

    from .plots import plot_unit_timeline

    ref = reference(MODEL)
    options = {} if shard_size == world_size else dict(hybrid_shard_size=shard_size)
    results = launch(_tour_rank, world_size, **options)
    grad_diff = max(max_abs_diff(r[0].grads, ref.grads) for r in results)
    diff = max(max_abs_diff(r[0].params, ref.params) for r in results)
    _, sent, memory, numels, timeline = results[0]
    model = build(MODEL, **build_args(MODEL)).model
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    memory_theory = sum(theory.sharded_state_bytes(numels, shard_size).values()) + 4 * frozen
    bytes_theory = theory.bytes_sent_per_step(numels, world_size, True, shard_size=shard_size)
    groups = "" if shard_size == world_size else f", shard groups of {shard_size}"
    fig = plot_unit_timeline(
        {f"rank 0 of {world_size}{groups}": timeline}, f"{label}: one step, unit by unit"
    )
    name = "fsdp" if shard_size == world_size else "fsdp_hybrid"
    fig.savefig(out_dir / f"{name}_timeline.png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return TourRow(
        label,
        diff < PARAM_TOL and grad_diff < GRAD_TOL,
        diff,
        memory_per_rank=memory,
        memory_theory=memory_theory,
        bytes_per_rank=sent,
        bytes_theory=sum(bytes_theory.values()),
    )


@tour_row("FSDP (ZeRO-3)", lesson=3)
def fsdp_row(world_size: int, out_dir: Path) -> TourRow:
    return _fsdp_row("FSDP (ZeRO-3)", world_size, out_dir, world_size)


@tour_row("FSDP hybrid", lesson=3)
def fsdp_hybrid_row(world_size: int, out_dir: Path) -> TourRow:
    return _fsdp_row("FSDP hybrid", world_size, out_dir, hybrid_shard_size(world_size))
