"""Pictures for notebook 00: who holds what before and after a collective, step by step.

- `plot_collective`: one row per rank, one coloured cell per element (use one element per
  chunk to read it as chunks), labelled with its value, before and after the collective.
  The colour follows the value, so a chunk that moved keeps its colour.
- `plot_ring_steps`: the same rows after every step of a ring algorithm, with the cells that
  changed in that step outlined (Patarasuk & Yuan 2009: reduce-scatter, then all-gather).
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.axes import Axes
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

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
            ax.add_patch(Rectangle(
                (j, -rank), 1, 0.9, facecolor=_CMAP(shade),
                edgecolor="black" if edge else "white", linewidth=2.5 if edge else 1,
            ))  # fmt: skip
            ax.text(j + 0.5, -rank + 0.45, f"{v:g}", ha="center", va="center", fontsize=9,
                    color="white" if shade > 0.6 else "black")  # fmt: skip
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
        1, 2, figsize=(1.6 + 0.55 * sum(widths), 0.8 + 0.45 * len(before)),
        gridspec_kw={"width_ratios": widths},
    )  # fmt: skip
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
