"""Lesson 17's pictures: which ranks form each group of a composed layout, and what a layout
sends and holds, measured beside planned.

The grid: one panel per group kind, the world drawn as one row per pipeline stage (pp
outermost, so a stage is a block of consecutive ranks), each group of the kind in its own
hue: tp groups are runs of consecutive ranks (inside a node), cp groups stride tp, and so
on outward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .dims import ParallelDims, grid_groups

KINDS = ("tp", "cp", "dp_shard", "dp_shard_cp", "dp_replicate", "ep", "pp")


def _hues(n: int) -> list:
    """n colours of different hues (tab10's, or evenly round the colour wheel past 10)."""
    if n <= 10:
        return [plt.get_cmap("tab10")(i) for i in range(n)]
    return [plt.get_cmap("hsv")(i / n) for i in range(n)]


def plot_grid(dims: ParallelDims, kinds: Sequence[str] = KINDS) -> Figure:
    """The groups of `grid_groups(dims)`, one panel per kind of `kinds` whose groups have more
    than one rank (a kind of size 1 groups nothing); each group of a panel in its own hue,
    each row a pipeline stage, labelled."""
    groups, world = grid_groups(dims), dims.world_size
    for kind in kinds:
        if kind not in groups:
            raise ValueError(f"plot_grid: kind={kind!r} must be one of {sorted(groups)}")
    shown = [k for k in kinds if len(groups[k][0]) > 1] or list(kinds[:1])
    per_stage = world // dims.pp
    size = (0.6 * per_stage + 1.4, (0.6 * dims.pp + 0.55) * len(shown))
    fig, axes = plt.subplots(len(shown), 1, figsize=size)
    axes = [axes] if len(shown) == 1 else list(axes)
    for ax, kind in zip(axes, shown):
        hues = _hues(len(groups[kind]))
        color = {r: hues[i] for i, g in enumerate(groups[kind]) for r in g}
        for rank in range(world):
            c, row = rank % per_stage, rank // per_stage
            ax.add_patch(
                Rectangle(
                    (c, -row - 1),
                    1,
                    1,
                    facecolor=color[rank],
                    alpha=0.75,
                    edgecolor="white",
                    linewidth=2,
                )
            )
            ax.text(
                c + 0.5,
                -row - 0.5,
                str(rank),
                ha="center",
                va="center",
                fontsize=11,
                fontweight="bold",
            )
        for row in range(dims.pp):
            ax.text(-0.1, -row - 0.5, f"stage {row}", ha="right", va="center", fontsize=10)
        ax.set_xlim(-1.3, per_stage)
        ax.set_ylim(-dims.pp, 0)
        ax.set_axis_off()
        n = len(groups[kind][0])
        ax.set_title(f"{kind}: {len(groups[kind])} groups of {n}", fontsize=11, loc="left")
    fig.tight_layout()
    return fig


def plot_planned_measured(measured: dict, planned: dict, layout: str = "") -> Figure:
    """Two panels, bytes sent per step by group kind and model states by kind, each kind's
    measured bar beside its planned one (`fixture.run_rank`'s `bytes` and `memory` against
    `theory.planned`'s), on a log axis so that small kinds show; kinds with nothing measured
    or planned are left out (and listed). `layout` names the run in the title."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, what, unit in zip(axes, ("bytes", "memory"), ("bytes sent per step", "bytes held")):
        kinds = [k for k in planned[what] if k in measured[what]]
        empty = [k for k in kinds if not measured[what][k] and not planned[what][k]]
        kinds = [k for k in kinds if k not in empty]
        xs = range(len(kinds))
        ax.bar([x - 0.2 for x in xs], [measured[what][k] for k in kinds], 0.4, label="measured")
        ax.bar([x + 0.2 for x in xs], [planned[what][k] for k in kinds], 0.4, label="planned")
        ax.set_yscale("log")
        values = [v for k in kinds for v in (measured[what][k], planned[what][k]) if v]
        if values:  # bars rise from a power of ten under the smallest, not from its foot
            ax.set_ylim(bottom=10 ** math.floor(math.log10(min(values)) - 1))
        ax.set_xticks(list(xs), kinds)
        ax.set_ylabel(unit)
        title = "bytes per group kind" if what == "bytes" else "model states per kind"
        ax.set_title(
            title + (f" (0: {', '.join(empty)})" if empty else ""), fontsize=10, loc="left"
        )
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", ncol=2, fontsize=10, frameon=False)
    fig.suptitle(
        f"{layout}: measured (the most over the ranks) and planned"
        if layout
        else "measured (the most over the ranks) and planned",
        x=0.01,
        ha="left",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig
