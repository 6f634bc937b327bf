"""Lesson 02's entries in the tour: ZeRO stages 1 and 2 against single-process Adam, and
weight-update sharding (Xu et al. 2020, "Automatic Cross-Replica Sharding of Weight Update
in Data-Parallel Training", arXiv:2004.13336, sections 3-4): each replica updates its shard
of the weights, and the all-gather of the updated weights waits until just before the next
forward (`gather_weights="before_forward"`, where it can overlap with the input pipeline),
ZeRO's other gather-when option. The same bytes and memory as ZeRO-1 (sharded optimizer
state, full gradients reduce-scattered)."""

from __future__ import annotations

from pathlib import Path

from ..data_parallel.buckets import MiB, plan_buckets
from ..data_parallel.fixture import build
from ..registry import TourRow, tour_row
from ..runtime import launch
from ..training import max_abs_diff
from . import theory
from .fixture import build_args, reference, train_on_rank

MODEL = "gpt"
# ~20 KiB buckets: the small GPT (Ψ = 26912) spreads over several flat buckets, each padded
# to a multiple of N and each a shard with its own Adam step counter.
TOUR_BUCKET_MB = 0.02
# float32, and Adam: the reduce-scatter sums the N partial gradients in another order than
# one process (a few ulps), and Adam's step m/sqrt(v) is about ±lr whatever the gradient's
# size, so where a gradient is a near-cancelling sum that error is not shrunk: after 5 steps
# at lr = 1e-2 parameters differ by up to ~3e-5 (see tests/test_zero.py). 1e-4 still fails
# any real mistake (a missed or doubled gradient moves a parameter by ~lr).
TOUR_TOL = 1e-4
WEIGHT_UPDATE_SHARDING = "weight-update sharding (Xu et al.)"


def memory_theory(name: str, world_size: int, stage: int, bucket_cap_mb: float) -> dict:
    """The formula for one rank of `ZeroDataParallel` on lesson model `name`: fp32 Adam on the
    padded trainable elements, plus frozen parameters and one Adam step counter per bucket."""
    model = build(name, **build_args(name)).model
    params = [p for p in model.parameters() if p.requires_grad]
    cap = int(bucket_cap_mb * MiB)
    plan = plan_buckets(params, cap, cap)
    padded = theory.padded_numel([sum(params[i].numel() for i in b) for b in plan], world_size)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    terms = theory.fp32_adam_rank_bytes(padded, world_size, stage, frozen, adam_steps=len(plan))
    return dict(terms=terms, padded=padded, buckets=len(plan), frozen=frozen)


def _zero_row(
    stage: int, world_size: int, out_dir: Path, gather_weights: str = "after_step"
) -> TourRow:
    import matplotlib.pyplot as plt

    from .plots import plot_memory_by_state

    ref = reference(MODEL)
    results = launch(
        train_on_rank,
        world_size,
        stage,
        MODEL,
        bucket_cap_mb=TOUR_BUCKET_MB,
        gather_weights=gather_weights,
    )
    diff = max(max_abs_diff(trace.params, ref.params) for trace, *_ in results)
    _, ledger, memory, _ = results[0]
    steps = len(ref.losses)
    # "full-grads" are the comparison contract's gathers (train() reads the gradients through
    # full_grads() every step): a check, not training traffic.
    sent = sum(r.ring_bytes for r in ledger.records if r.tag != "full-grads") / steps
    expected = memory_theory(MODEL, world_size, stage, TOUR_BUCKET_MB)
    formula = {s: theory.fp32_adam_bytes(expected["padded"], world_size, s) for s in theory.STAGES}
    measured = {stage: vars(memory)}
    fig = plot_memory_by_state(
        formula, measured, f"ZeRO-{stage}, GPT, {world_size} ranks: measured rank 0 vs formula"
    )
    fig.savefig(out_dir / f"zero{stage}_{gather_weights}_memory.png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    label = f"ZeRO-{stage}" if gather_weights == "after_step" else WEIGHT_UPDATE_SHARDING
    return TourRow(
        label,
        diff < TOUR_TOL,
        diff,
        memory_per_rank=memory.total,
        memory_theory=int(sum(expected["terms"].values())),
        bytes_per_rank=sent,
        bytes_theory=theory.bytes_sent_per_step(expected["padded"], world_size, stage),
    )


@tour_row("ZeRO-1", lesson=2)
def zero1_row(world_size: int, out_dir: Path) -> TourRow:
    return _zero_row(1, world_size, out_dir)


@tour_row("ZeRO-2", lesson=2)
def zero2_row(world_size: int, out_dir: Path) -> TourRow:
    return _zero_row(2, world_size, out_dir)


@tour_row(WEIGHT_UPDATE_SHARDING, lesson=2)
def weight_update_sharding_row(world_size: int, out_dir: Path) -> TourRow:
    return _zero_row(1, world_size, out_dir, gather_weights="before_forward")
