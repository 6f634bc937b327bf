"""Pictures for lesson 00: who holds what before and after a collective, and what it costs.

- `plot_collective`: one row per rank, one coloured cell per element (use one element per
  chunk to read it as chunks), labelled with its value, before and after the collective.
  The colour follows the value, so a chunk that moved keeps its colour.
- `plot_ring_steps`: the same rows after every step of a ring algorithm, with the cells that
  changed in that step outlined (Patarasuk & Yuan 2009: reduce-scatter, then all-gather).
- `plot_cost_model`: measured all-reduce time vs size on log-log axes with the fitted α-β
  line (Hockney 1994): flat where the latency α dominates, slope 1 where bandwidth does.

Every function returns a matplotlib Figure and shows nothing itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .. import comm
from .cost_model import CostModel

_CMAP = plt.get_cmap("YlGnBu")


def _norm(states: Sequence[Sequence[torch.Tensor]]) -> Normalize:
    values = torch.cat([t.reshape(-1).float() for state in states for t in state])
    return Normalize(float(values.min()), float(values.max()) or 1.0)


def _draw_holdings(
    ax: Axes,
    tensors: Sequence[torch.Tensor],
    title: str,
    norm: Normalize,
    chunk: int | None = None,
    changed: Sequence[torch.Tensor] | None = None,
) -> None:
    width = max(t.numel() for t in tensors)
    for rank, t in enumerate(tensors):
        for j, v in enumerate(t.reshape(-1).tolist()):
            shade = norm(v)
            edge = changed is not None and bool(changed[rank][j])
            ax.add_patch(
                Rectangle(
                    (j, -rank),
                    1,
                    0.9,
                    facecolor=_CMAP(shade),
                    edgecolor="black" if edge else "white",
                    linewidth=2.5 if edge else 1,
                )
            )
            ax.text(
                j + 0.5,
                -rank + 0.45,
                f"{v:g}",
                ha="center",
                va="center",
                fontsize=9,
                color="white" if shade > 0.6 else "black",
            )
        if chunk:
            # thin gaps between elements, thick ones between chunks
            for b in range(chunk, t.numel(), chunk):
                ax.plot([b, b], [-rank, -rank + 0.9], color="dimgray", linewidth=2)
    ax.set_xlim(0, width)
    ax.set_ylim(-len(tensors) + 0.9, 1)
    ax.set_yticks([-r + 0.45 for r in range(len(tensors))])
    ax.set_yticklabels([f"rank {r}" for r in range(len(tensors))])
    ax.set_xticks([])
    ax.set_title(title, fontsize=10)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)


def plot_collective(
    name: str,
    before: Sequence[torch.Tensor],
    after: Sequence[torch.Tensor],
    chunk: int | None = None,
) -> Figure:
    """Each rank's tensor before and after collective `name` (a thick line every `chunk`)."""
    widths = [max(t.numel() for t in before), max(t.numel() for t in after)]
    fig, axes = plt.subplots(
        1,
        2,
        figsize=(1.6 + 0.55 * sum(widths), 0.8 + 0.45 * len(before)),
        gridspec_kw={"width_ratios": widths},
    )
    norm = _norm([before, after])
    _draw_holdings(axes[0], before, "before", norm, chunk)
    _draw_holdings(axes[1], after, "after", norm, chunk)
    axes[1].set_yticklabels([])
    fig.suptitle(name, fontsize=12)
    fig.tight_layout()
    return fig


def plot_ring_steps(steps: Sequence[tuple[str, Sequence[torch.Tensor]]], chunk: int) -> Figure:
    """One panel per (title, per-rank tensors) step; cells changed since the last step outlined."""
    cols = min(len(steps), 4)
    rows = -(-len(steps) // cols)
    n, width = len(steps[0][1]), steps[0][1][0].numel()
    fig, axes = plt.subplots(
        rows, cols, figsize=(cols * (1.2 + 0.5 * width), rows * (0.7 + 0.4 * n)), squeeze=False
    )
    norm = _norm([state for _, state in steps])
    previous = None
    for ax, (title, state) in zip(axes.flat, steps):
        changed = None if previous is None else [a != b for a, b in zip(state, previous)]
        _draw_holdings(ax, state, title, norm, chunk, changed)
        previous = state
    for ax in list(axes.flat)[len(steps) :]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig


def plot_cost_model(
    measured: dict[int, tuple[list[int], list[float]]], models: dict[int, CostModel]
) -> Figure:
    """Measured all-reduce seconds (points) and the fitted α-β model (lines), per world size.

    `measured[N]` is (tensor sizes in bytes, seconds); `models[N]` the fit for that N.
    """
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, (n, (sizes, seconds)) in enumerate(sorted(measured.items())):
        color = f"C{i}"
        ax.plot(sizes, np.asarray(seconds) * 1e3, "o", color=color, label=f"measured, N={n}")
        if n in models:
            m = models[n]
            grid = np.geomspace(min(sizes), max(sizes), 100)
            ax.plot(
                grid,
                m.predict(comm.ring_bytes("all_reduce", 1, n) * grid) * 1e3,
                "-",
                color=color,
                label=f"α-β fit, N={n}: α={m.alpha_s * 1e6:.0f} µs, "
                f"bw={m.bandwidth_bytes_per_s / 1e9:.2f} GB/s",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tensor size S (bytes)")
    ax.set_ylabel("all-reduce time (ms)")
    ax.set_title("time = α + 2(N-1)/N·S / bandwidth")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig
