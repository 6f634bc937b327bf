"""Pictures for 3D parallelism (notebook 10). The rank grid is lesson 08's
`minidist.megatron.plots.plot_rank_grid`.

- `plot_losses`: the 3D run's loss curve next to one process's, and their difference.
- `plot_bytes_by_kind`: bytes per step by group kind (tp, pp, dp) per rank, measured bars
  beside the theory's marks.

Every function returns a matplotlib Figure and shows nothing itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure


def plot_losses(losses: Sequence[float], reference: Sequence[float], label: str) -> Figure:
    fig, (ax, dx) = plt.subplots(1, 2, figsize=(9, 3.2))
    steps = range(len(reference))
    ax.plot(steps, reference, "k-", linewidth=3, alpha=0.35, label="one process")
    ax.plot(steps, losses, "C0o--", markersize=3, label=label)
    ax.set(xlabel="step", ylabel="loss", title="loss per step")
    ax.legend()
    dx.plot(steps, [abs(a - b) for a, b in zip(losses, reference)], "C3o-", markersize=3)
    dx.set(
        xlabel="step",
        ylabel="|difference|",
        title="3D minus one process",
        yscale="symlog",
        ylim=(0, 1e-5),
    )
    dx.set_yscale("symlog", linthresh=1e-8)
    fig.tight_layout()
    return fig


def plot_bytes_by_kind(
    measured: Sequence[Mapping[str, float]], theory: Sequence[Mapping[str, float]]
) -> Figure:
    """One group of bars per rank: tp, pp, dp bytes per step; theory as black ticks."""
    kinds = ("tp", "pp", "dp")
    fig, ax = plt.subplots(figsize=(9, 3.2))
    width = 0.27
    for k, kind in enumerate(kinds):
        xs = [r + (k - 1) * width for r in range(len(measured))]
        ax.bar(xs, [m[kind] / 1024 for m in measured], width, color=f"C{k}", label=kind)
        ax.scatter(
            xs,
            [t[kind] / 1024 for t in theory],
            marker="_",
            s=200,
            color="black",
            zorder=3,
            label="theory" if k == 0 else None,
        )
    ax.set_xticks(range(len(measured)), [f"rank {r}" for r in range(len(measured))])
    ax.set(ylabel="KiB sent per step", title="bytes per step by group kind")
    ax.legend(
        ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.12), frameon=False
    )  # no bar hidden
    fig.tight_layout()
    return fig
