"""Lesson 16's entries in the harnesses: the "expert parallel" and "expert parallel GPT" rows.

`ExpertParallelMoE` (E = 8 experts, k = 2, capacity factor 1) on the tour's world, as EP × DP
where the world divides: e = 2 experts-groups × d = n/2 data-parallel copies (every rank
routes its own tokens; the experts' gradients reduce over the d ranks holding them), against
the same MoE in one process for 3 steps: the same drops; outputs and parameters within 1e-5,
gradients within 1e-5 of their largest entry. Bytes per step against
`theory.bytes_sent_per_step` for the routing the ranks measured; memory: the parameters a
rank holds (the router and E/e experts) against the formula.

"expert parallel GPT": `ExpertParallelGPT` (every block's MLP an MoE of 4 experts, top-2,
padded to capacity: GShard's static shapes) as e = 2 × d = n/2, against the same GPT in one
process for 3 steps of SGD + momentum: losses and parameters within 1e-5. Bytes per step
against `theory.padded_bytes_sent_per_step`, which needs no routing (lesson 13's planner
plans this row); memory: model states per rank against `theory.model_state_bytes_per_rank`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..registry import TourRow, tour_row
from ..runtime import launch
from . import theory
from .fixture import (
    GPT_BATCH,
    GPT_MOE,
    MOE_GPT,
    SIZES,
    TOKENS,
    build_gpt,
    gpt_reference,
    gpt_train_on_rank,
    reference,
    send_matrix,
    train_on_rank,
)
from .gpt import is_expert
from .routing import capacity


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
    theory_bytes = (
        sum(
            theory.bytes_sent_per_step(
                send_matrix(runs, e, s),
                0,
                SIZES["hidden"],
                SIZES["num_experts"],
                runs[0].router_params,
                runs[0].expert_params,
                n,
                n // e,
            )
            for s in range(steps)
        )
        / steps
    )
    h, f, experts = SIZES["hidden"], SIZES["ffn"], SIZES["num_experts"]
    expert = 2 * h * f + f + h
    return TourRow(
        f"expert parallel (E={experts}, k={k}, e={e} x d={n // e}; memory: params/rank)",
        matches,
        worst,
        memory_per_rank=4 * (runs[0].router_params + runs[0].expert_params),
        memory_theory=4 * (h * experts + experts // e * expert),
        bytes_per_rank=sum(r.ring_bytes for r in runs[0].records) / steps,
        bytes_theory=theory_bytes,
    )


def gpt_theory(world_size: int, e: int) -> tuple[int, float]:
    """(model states per rank, bytes per step) of the "expert parallel GPT" row, from the
    model's parameter counts and `theory` alone."""
    model, _ = build_gpt(world_size, steps=0)
    named = list(model.named_parameters())
    experts = sum(p.numel() for n, p in named if is_expert(n))
    replicated = sum(p.numel() for n, p in named if not is_expert(n))
    tokens = GPT_BATCH // world_size * MOE_GPT["seq_len"]
    cap = capacity(tokens, GPT_MOE["experts"], GPT_MOE["k"], GPT_MOE["capacity_factor"])
    sent = theory.padded_bytes_sent_per_step(
        MOE_GPT["layers"],
        GPT_MOE["experts"],
        e,
        cap,
        MOE_GPT["hidden"],
        replicated,
        experts // e,
        world_size,
        world_size // e,
    )
    return theory.model_state_bytes_per_rank(replicated, experts, e), sent


@tour_row("expert parallel GPT", lesson=16)
def expert_parallel_gpt_row(world_size: int, out_dir: Path) -> TourRow:
    n = world_size
    e = 2 if n % 2 == 0 else 1
    runs = launch(gpt_train_on_rank, n, e)
    ref = gpt_reference(n)
    steps = len(ref.losses)
    losses = [sum(r.losses[s] for r in runs) / n for s in range(steps)]
    worst = max(abs(a - b) for a, b in zip(losses, ref.losses))
    for run in runs:
        for name, p in run.params.items():
            worst = max(worst, float((p - ref.params[name]).abs().max()))
    memory, sent = gpt_theory(n, e)
    return TourRow(
        f"expert parallel GPT (E={GPT_MOE['experts']}, k={GPT_MOE['k']}, padded to capacity, "
        f"e={e} x d={n // e}; memory: model states/rank)",
        worst < 1e-5,
        worst,
        memory_per_rank=runs[0].memory.total,
        memory_theory=memory,
        bytes_per_rank=sum(r.ring_bytes for r in runs[0].records) / steps,
        bytes_theory=sent,
    )
