"""Lesson 16's entry in the harnesses: the "expert parallel" tour row.

`ExpertParallelMoE` (E = 8 experts, k = 2, capacity factor 1) on the tour's world, as EP × DP
where the world divides: e = 2 experts-groups × d = n/2 data-parallel copies (every rank
routes its own tokens; the experts' gradients reduce over the d ranks holding them), against
the same MoE in one process for 3 steps: the same drops; outputs and parameters within 1e-5,
gradients within 1e-5 of their largest entry. Bytes per step against
`theory.bytes_sent_per_step` for the routing the ranks measured; memory: the parameters a
rank holds (the router and E/e experts) against the formula.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..registry import TourRow, tour_row
from ..runtime import launch
from . import theory
from .fixture import SIZES, TOKENS, reference, send_matrix, train_on_rank


def tour_e(world_size: int) -> int:
    """2 experts-groups where the world is even (× n/2 data parallel), else the whole world
    when it divides E, else 1."""
    if world_size % 2 == 0:
        return 2
    return world_size if SIZES["num_experts"] % world_size == 0 else 1


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest difference over the largest entry (a gradient's scale is about 1e-4)."""
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))


def _diff(runs, n, ref, ref_params) -> tuple[bool, float]:
    same, worst = True, 0.0
    for rank, run in enumerate(runs):
        rows = slice(rank * TOKENS, (rank + 1) * TOKENS)
        for mine, want in zip(run.trace, ref):
            same &= torch.equal(mine.kept, want.kept[rows])
            worst = max(worst, float((mine.out - want.out[rows]).abs().max()))
            for name, g in mine.grads.items():
                full = want.grads[name][rows] if name == "input" else want.grads[name]
                worst = max(worst, _relative(g, full))
        for name, p in run.params.items():
            worst = max(worst, float((p - ref_params[name]).abs().max()))
    return same and worst < 1e-5, worst


@tour_row("expert parallel", lesson=16)
def expert_parallel_row(world_size: int, out_dir: Path) -> TourRow:
    n, e = world_size, tour_e(world_size)
    k, cf = 2, 1.0
    runs = launch(train_on_rank, n, e, k, cf)
    ref, ref_params = reference(n, k, cf)
    matches, worst = _diff(runs, n, ref, ref_params)
    steps = len(runs[0].trace)
    theory_bytes = sum(
        theory.bytes_sent_per_step(send_matrix(runs, e, s), 0, SIZES["hidden"],
                                   SIZES["num_experts"], runs[0].router_params,
                                   runs[0].expert_params, n, n // e)
        for s in range(steps)
    ) / steps  # fmt: skip
    h, f, experts = SIZES["hidden"], SIZES["ffn"], SIZES["num_experts"]
    expert = 2 * h * f + f + h
    return TourRow(
        f"expert parallel (E={experts}, k={k}, e={e} x d={n // e}; memory: params/rank)",
        matches, worst,
        memory_per_rank=4 * (runs[0].router_params + runs[0].expert_params),
        memory_theory=4 * (h * experts + experts // e * expert),
        bytes_per_rank=sum(r.ring_bytes for r in runs[0].records) / steps,
        bytes_theory=theory_bytes,
    )  # fmt: skip
