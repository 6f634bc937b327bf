"""Lesson 17's picture: which ranks form each group of a composed layout.

One panel per group kind, the world drawn as one row per pipeline stage (pp outermost, so a
stage is a block of consecutive ranks), each group of the kind in its own colour: tp groups
are runs of consecutive ranks (inside a node), cp groups stride tp, and so on outward.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .dims import ParallelDims, grid_groups

KINDS = ("tp", "cp", "dp_shard_cp", "dp_replicate", "ep", "pp")


def plot_grid(dims: ParallelDims, kinds: Sequence[str] = KINDS) -> Figure:
    """The groups of `grid_groups(dims)`, one panel per kind."""
    groups, world = grid_groups(dims), dims.world_size
    per_stage = world // dims.pp
    cmap = plt.get_cmap("tab20")
    size = (0.55 * per_stage + 1.5, (0.5 * dims.pp + 0.6) * len(kinds))
    fig, axes = plt.subplots(len(kinds), 1, figsize=size)
    axes = [axes] if len(kinds) == 1 else list(axes)
    for ax, kind in zip(axes, kinds):
        if kind not in groups:
            raise ValueError(f"plot_grid: kind={kind!r} must be one of {sorted(groups)}")
        color = {r: cmap(i % 20) for i, g in enumerate(groups[kind]) for r in g}
        for rank in range(world):
            c, row = rank % per_stage, rank // per_stage
            ax.add_patch(Rectangle((c, -row - 1), 1, 1, facecolor=color[rank],
                                   edgecolor="white", linewidth=2))  # fmt: skip
            ax.text(c + 0.5, -row - 0.5, str(rank), ha="center", va="center", fontsize=8)
        ax.set_xlim(0, per_stage)
        ax.set_ylim(-dims.pp, 0)
        ax.set_axis_off()
        size = len(groups[kind][0])
        ax.set_title(f"{kind}: {len(groups[kind])} groups of {size}", fontsize=9, loc="left")
    fig.tight_layout()
    return fig


def plot_planned_measured(measured: dict, planned: dict) -> Figure:
    """Two panels, bytes sent per step by group kind and model states by kind, each kind's
    measured bar beside its planned one (`fixture.run_rank`'s `bytes` and `memory` against
    `theory.planned`'s)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    for ax, what, unit in zip(axes, ("bytes", "memory"), ("bytes sent per step", "bytes held")):
        kinds = [k for k in planned[what] if k in measured[what]]
        xs = range(len(kinds))
        ax.bar([x - 0.2 for x in xs], [measured[what][k] for k in kinds], 0.4, label="measured")
        ax.bar([x + 0.2 for x in xs], [planned[what][k] for k in kinds], 0.4, label="planned")
        ax.set_xticks(list(xs), kinds)
        ax.set_ylabel(unit)
        ax.set_title(f"{what} per group kind" if what == "bytes" else "model states per kind",
                     fontsize=9, loc="left")  # fmt: skip
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
