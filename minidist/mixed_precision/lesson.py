"""Lesson 04's entries in the tour: FSDP and ZeRO-2 computing in bf16 against fp32 Adam.

Both rows train lesson 01's GPT with Adam on fp32 master weights while forward, backward and
the parameter all-gathers run in bf16, and compare with the same model trained in fp32 in
one process (`minidist.zero.fixture.reference`). Low precision cannot match fp32 to float32
rounding, so "matches" means it *tracks* fp32 (`tracks_fp32`): the loss within `LOSS_TOL`
and the parameters within `PATH_TOL` of the distance fp32 training moved them. The
largest loss difference is what the row reports. Memory per rank is measured against
(2 + 2 + 12)Ψ sharded by stage (`theory.rank_bytes`), bytes per step against the theory
with the all-gathers in bf16 (half of fp32's) and the reductions in fp32.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..data_parallel.fixture import build
from ..fsdp import fixture as fsdp_fixture
from ..fsdp import theory as fsdp_theory
from ..policy import MixedPrecision
from ..registry import TourRow, tour_row
from ..runtime import launch
from ..training import TrainTrace
from ..zero import fixture as zero_fixture
from ..zero.lesson import TOUR_BUCKET_MB
from ..zero.lesson import memory_theory as zero_layout
from . import theory

MODEL = "gpt"
# bf16 keeps 8 significant bits (relative rounding 2^-9 ≈ 2e-3 per operation), fp16 11 bits:
# the GPT's loss (about 3.4) then differs from fp32 by about 1e-3 (bf16) and 1e-4 (fp16)
# over 5 steps. Parameters are compared as a whole, against how far fp32 training moved
# them: single elements with near-zero gradients can take an Adam step of the other sign
# (±lr), and lr = 1e-2 is as large as the weights themselves. Measured: bf16 6%, fp16 3%
# of the distance travelled (fp32 through the same code: 1e-5).
LOSS_TOL = {torch.bfloat16: 5e-3, torch.float16: 1e-3}
PATH_TOL = {torch.bfloat16: 0.15, torch.float16: 0.08}
# The comparison contract's gathers (FSDP tags them "full-state", ZeRO "full-grads"): `train`
# reads the gradients every step and the parameters at the end. A check, not training.
CONTRACT_TAGS = ("full-state", "full-grads")


def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The L2 distance between two sets of parameters (the names of `b`), in float64 sums."""
    return sum(float((a[k].float() - b[k].float()).pow(2).sum()) for k in b) ** 0.5


def start_parameters(name: str = MODEL) -> dict[str, torch.Tensor]:
    """The model's parameters before training (what every run starts from)."""
    return {n: p.detach().clone() for n, p in build(name).model.named_parameters()}


def tracks_fp32(
    losses: list[list[float]],
    params: list[dict[str, torch.Tensor]],
    reference: TrainTrace,
    dtype: torch.dtype,
) -> tuple[bool, float, float]:
    """Does low-precision training track fp32? `losses` per rank (each rank's slice: their
    mean is the global loss), `params` per rank after the last step, `reference` fp32 in one
    process. Returns (within both tolerances, largest loss difference, largest parameter
    distance as a fraction of the distance fp32 travelled)."""
    mean = torch.tensor(losses, dtype=torch.float64, device="cpu").mean(0)
    loss_diff = float(
        (mean - torch.tensor(reference.losses, dtype=torch.float64, device="cpu")).abs().max()
    )
    travelled = distance(start_parameters(), reference.params)
    path = max(distance(p, reference.params) for p in params) / travelled
    return loss_diff < LOSS_TOL[dtype] and path < PATH_TOL[dtype], loss_diff, path


def training_bytes_per_step(ledger, steps: int) -> float:
    """Bytes a rank sent per training step (ring model), the contract's gathers left out."""
    return sum(r.ring_bytes for r in ledger.records if r.tag not in CONTRACT_TAGS) / steps


def _save_losses(out_dir: Path, label: str, runs, ref: TrainTrace, filename: str) -> None:
    import matplotlib.pyplot as plt

    from .plots import plot_loss_curves

    losses = torch.tensor([trace.losses for trace, *_ in runs], device="cpu").mean(0).tolist()
    fig = plot_loss_curves(
        {label: losses},
        ref.losses,
        f"{label} vs fp32 in one process",
        tolerances={label: LOSS_TOL[torch.bfloat16]},
    )
    fig.savefig(out_dir / filename, dpi=100, bbox_inches="tight")
    plt.close(fig)


@tour_row("FSDP + bf16", lesson=4)
def fsdp_bf16_row(world_size: int, out_dir: Path) -> TourRow:
    policy = MixedPrecision(torch.bfloat16)
    ref = zero_fixture.reference(MODEL)
    runs = launch(fsdp_fixture.train_on_rank, world_size, MODEL, mixed_precision=policy)
    ok, loss_diff, _ = tracks_fp32(
        [t.losses for t, *_ in runs], [t.params for t, *_ in runs], ref, policy.param_dtype
    )
    _, ledger, memory, numels = runs[0]
    frozen = sum(p.numel() for p in build(MODEL).model.parameters() if not p.requires_grad)
    padded = sum(fsdp_theory.padded(n, world_size) for n in numels)
    _save_losses(out_dir, "FSDP + bf16", runs, ref, "fsdp_bf16_loss.png")
    return TourRow(
        "FSDP + bf16",
        ok,
        loss_diff,
        memory_per_rank=memory.total,
        memory_theory=theory.rank_bytes(padded, world_size, 3, frozen, adam_steps=len(numels)),
        bytes_per_rank=training_bytes_per_step(ledger, len(ref.losses)),
        bytes_theory=sum(theory.fsdp_bytes_sent_per_step(numels, world_size, policy).values()),
    )


@tour_row("ZeRO-2 + bf16", lesson=4)
def zero2_bf16_row(world_size: int, out_dir: Path) -> TourRow:
    policy = MixedPrecision(torch.bfloat16)
    ref = zero_fixture.reference(MODEL)
    runs = launch(
        zero_fixture.train_on_rank,
        world_size,
        2,
        MODEL,
        mixed_precision=policy,
        bucket_cap_mb=TOUR_BUCKET_MB,
    )
    ok, loss_diff, _ = tracks_fp32(
        [t.losses for t, *_ in runs], [t.params for t, *_ in runs], ref, policy.param_dtype
    )
    _, ledger, memory, _ = runs[0]
    layout = zero_layout(MODEL, world_size, 2, TOUR_BUCKET_MB)  # buckets, padding, frozen
    padded = layout["padded"]
    _save_losses(out_dir, "ZeRO-2 + bf16", runs, ref, "zero2_bf16_loss.png")
    return TourRow(
        "ZeRO-2 + bf16",
        ok,
        loss_diff,
        memory_per_rank=memory.total,
        memory_theory=theory.rank_bytes(
            padded, world_size, 2, layout["frozen"], adam_steps=layout["buckets"]
        ),
        bytes_per_rank=training_bytes_per_step(ledger, len(ref.losses)),
        bytes_theory=sum(theory.zero_bytes_sent_per_step(padded, world_size, policy).values()),
    )
