"""Lesson 10's entry in the harnesses: the "3D (TP x PP x DP)" tour row.

`ThreeDParallel` (tensor-parallel pipeline stages, 1F1B over 4 micro-batches) with ZeRO-1
over the data-parallel group, 20 steps of SGD with momentum on the course GPT, against the
GPT in one process. It needs t·p·d ranks: t = 2 × p = 2 × d = 2 on a world of 8 or more;
on a smaller world (the tour runs on 4) t = 2 × p = 2 × d = 1, named in the row's label.
Memory: rank 0's parameters, gradients, ZeRO-1's chunk, its gradient and SGD's momentum of
it, measured with `minidist.memory.model_state_bytes`, against
`theory.model_state_bytes_per_rank`. Bytes: what rank 0 sends per step on its tp, pp
(with the embedding group) and dp groups against `theory.bytes_sent_per_step`, summed; the
loss's broadcast and mean and the comparison contract's gathers (tags "pp-loss", "loss",
"full-state") left out. The rank grid goes to `three_d_grid.png`.
"""

from __future__ import annotations

from pathlib import Path

from ..registry import TourRow, tour_row
from ..runtime import launch
from ..training import max_abs_diff
from .fixture import (
    LOSS_TOL,
    PARAM_TOL,
    measured_on_rank,
    reference_losses,
    reference_params,
    theory_for,
)


def tour_shape(world_size: int) -> tuple[int, int, int]:
    """(t, p, d) of the tour row: 2 × 2 × 2 on 8 ranks or more, else 2 × 2 × 1 (4 ranks)."""
    if world_size >= 8:
        return 2, 2, 2
    if world_size >= 4:
        return 2, 2, 1
    raise ValueError(f"3D tour row: world_size={world_size} must be >= 4 (t = 2 × p = 2)")


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


@tour_row("3D (TP x PP x DP)", lesson=10)
def three_d_row(world_size: int, out_dir: Path) -> TourRow:
    from ..megatron.plots import plot_rank_grid

    tp, pp, dp = tour_shape(world_size)
    n = tp * pp * dp
    runs = launch(measured_on_rank, n, tp, pp, timeout_s=600)
    ref_losses, ref_params = reference_losses(), reference_params()
    diffs = [max_abs_diff(r["params"], ref_params) for r in runs]
    losses_ok = all(
        max(abs(a - b) for a, b in zip(r["losses"], ref_losses)) < LOSS_TOL for r in runs
    )
    r0 = runs[0]
    want = theory_for(r0["stage"], tp, pp, dp)
    _save(plot_rank_grid(n, tp, pp, gpus_per_node=n // pp), out_dir / "three_d_grid.png")
    return TourRow(
        f"3D (t={tp} x p={pp} x d={dp}, {n} ranks)",
        losses_ok and max(diffs) < PARAM_TOL,
        max(diffs),
        memory_per_rank=r0["memory"],
        memory_theory=want["memory"],
        bytes_per_rank=sum(r0["sent"].values()),
        bytes_theory=sum(want["sent"].values()),
    )
