"""Lesson 06's entries in the harnesses: the tour rows "recompute" and "FSDP + recompute",
and the `memory` bench (lessons 01-06 side by side, in `bench.py`).

"recompute" runs in one process (no bytes are sent): the course GPT with every block
recomputed against the same model run plainly, dropout on (gradients bit for bit), and
lesson 02/03's GPT with every block recomputed, trained with Adam, against the same
single-process reference (`minidist.zero.fixture.reference`), bit for bit too. Its memory
is the activation bytes forward saves for backward (`SavedActivations`): measured with
recomputation, next to what the plain model keeps outside the blocks plus
`theory.saved_bytes(L, a, b, 1)["forward"]`, L block inputs, where a (what a block would
keep, `theory.course_block_bytes`) and b come from the formulas.

"FSDP + recompute" runs lesson 03's FSDP (a unit per block) with every block recomputed on
the world: equal to the reference within FSDP's tolerances; the activation bytes rank 0
saves in forward next to the same count on its slice of the batch; bytes sent per step next
to FSDP's theory (recomputation adds no communication: the gather FSDP does before a
unit's backward serves the recomputation).
"""

from __future__ import annotations

from pathlib import Path

from ..registry import TourRow, tour_row
from ..runtime import launch
from ..training import max_abs_diff
from . import bench, theory  # noqa: F401 (importing bench registers `bench memory`)
from .fixture import (
    DROPOUT_GPT,
    fsdp_on_rank,
    gpt_dims,
    local_plain_saved,
    saved_and_grads,
    saved_by_part,
    train_recomputed,
)


def activation_theory(
    plain_bytes: int,
    seq: int,
    batch: int,
    hidden: int,
    heads: int,
    layers: int,
    dropout: bool,
    segment: int | None = 1,
) -> int:
    """Bytes forward saves with blocks recomputed in segments of `segment`: what the plain
    model keeps outside its blocks (measured `plain_bytes` less L·M_act from the formula) plus
    Chen et al.'s kept segment inputs."""
    a = theory.course_block_bytes(seq, batch, hidden, heads, dropout)
    b = theory.boundary_bytes(seq, batch, hidden)
    outside = plain_bytes - layers * a
    return outside + theory.saved_bytes(layers, a, b, segment)["forward"]


@tour_row("recompute", lesson=6)
def recompute_row(world_size: int, out_dir: Path) -> TourRow:
    import matplotlib.pyplot as plt

    from ..zero.fixture import reference
    from .plots import plot_saved_by_part

    plain_bytes, plain = saved_and_grads("plain")
    recomputed_bytes, recomputed = saved_and_grads("recompute")
    diff = max(
        max_abs_diff(recomputed, plain),
        max_abs_diff(train_recomputed().params, reference("gpt").params),
    )
    dims = gpt_dims(**DROPOUT_GPT)
    expected = activation_theory(plain_bytes, **dims, dropout=True)
    fig = plot_saved_by_part(
        saved_by_part("plain"),
        saved_by_part("recompute"),
        "GPT of 4 blocks, dropout on: bytes saved for backward, by part",
    )
    fig.savefig(out_dir / "recompute_saved_bytes.png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return TourRow(
        "recompute",
        diff == 0.0,
        diff,
        memory_per_rank=recomputed_bytes,
        memory_theory=expected,
        bytes_per_rank=None,
        bytes_theory=None,
    )


# FSDP's tolerances (minidist/fsdp/lesson.py): gradients to float32 summation order, Adam's
# ±lr steps keep a near-cancelling gradient's relative error in the parameters.
GRAD_TOL, PARAM_TOL = 1e-6, 1e-4


@tour_row("FSDP + recompute", lesson=6)
def fsdp_recompute_row(world_size: int, out_dir: Path) -> TourRow:
    from ..fsdp import theory as fsdp_theory
    from ..zero.fixture import reference

    ref = reference("gpt")
    results = launch(fsdp_on_rank, world_size, True)
    grad_diff = max(max_abs_diff(r["trace"].grads, ref.grads) for r in results)
    diff = max(max_abs_diff(r["trace"].params, ref.params) for r in results)
    first = results[0]
    plain_bytes, local_batch = local_plain_saved(world_size, rank=0)
    dims = {**gpt_dims(), "batch": local_batch}
    sent_theory = fsdp_theory.bytes_sent_per_step(first["numels"], world_size, True)
    return TourRow(
        "FSDP + recompute",
        diff < PARAM_TOL and grad_diff < GRAD_TOL,
        diff,
        memory_per_rank=first["forward"],
        memory_theory=activation_theory(plain_bytes, **dims, dropout=False),
        bytes_per_rank=first["sent"],
        bytes_theory=sum(sent_theory.values()),
    )
