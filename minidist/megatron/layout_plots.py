"""Pictures for the parallel layout (notebook 08; the rank grid also in notebook 10).

- `plot_rank_grid`: the ranks of a t·p·d world as a grid (one row per pipeline stage), one
  panel per group kind, groups coloured, nodes outlined (Narayanan et al. 2021, "Efficient
  Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", section 3).
- `plot_comm_seconds`: α-β seconds per step of communication over two kinds of link,
  against the compute.

Both are re-exported by `minidist.megatron.plots`, where the notebooks import them. Every
function returns a matplotlib Figure and shows nothing itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .layout import parallel_groups

_CMAP = plt.get_cmap("tab10")


_KIND_TITLES = {
    "tp": "tensor-parallel groups",
    "dp": "data-parallel groups",
    "pp": "pipeline groups",
    "mp": "model-parallel groups (one replica)",
    "embedding": "embedding groups",
}


def plot_rank_grid(
    world_size: int,
    tp: int,
    pp: int,
    gpus_per_node: int = 8,
    kinds: Sequence[str] = ("tp", "dp", "pp"),
) -> Figure:
    """The ranks of `parallel_groups(world_size, tp, pp)`: one row per pipeline stage (its
    block of n/p consecutive ranks), one panel per group kind, each group its own colour,
    each node of `gpus_per_node` consecutive ranks outlined."""
    groups = parallel_groups(world_size, tp, pp)
    per_stage = world_size // pp
    cmap = plt.get_cmap("tab20")
    fig, axes = plt.subplots(1, len(kinds), figsize=(3.6 * len(kinds), 0.8 * pp + 1.3))
    axes = [axes] if len(kinds) == 1 else list(axes)

    def cell(rank):  # (column, row from the top)
        return rank % per_stage, rank // per_stage

    for ax, kind in zip(axes, kinds):
        color = {r: cmap(i % 20) for i, g in enumerate(groups[kind]) for r in g}
        for rank in range(world_size):
            c, row = cell(rank)
            ax.add_patch(
                Rectangle(
                    (c, -row - 1),
                    1,
                    1,
                    facecolor=color.get(rank, "white"),
                    edgecolor="white",
                    linewidth=2,
                )
            )
            ax.text(c + 0.5, -row - 0.5, str(rank), ha="center", va="center", fontsize=9)
        for node in range(-(-world_size // gpus_per_node)):
            ranks = range(node * gpus_per_node, min(world_size, (node + 1) * gpus_per_node))
            cells = [cell(r) for r in ranks]
            c0, c1 = min(c for c, _ in cells), max(c for c, _ in cells) + 1
            r0, r1 = min(r for _, r in cells), max(r for _, r in cells) + 1
            if len(cells) == (c1 - c0) * (r1 - r0):  # the node is a rectangle of the grid
                ax.add_patch(
                    Rectangle(
                        (c0 + 0.04, -r1 + 0.04),
                        c1 - c0 - 0.08,
                        r1 - r0 - 0.08,
                        fill=False,
                        edgecolor="black",
                        linewidth=2.2,
                        linestyle="--",
                    )
                )
                if c0 == 0 and c1 == per_stage:  # whole rows: label on the right
                    ax.text(
                        c1 + 0.08,
                        -(r0 + r1) / 2,
                        f"node {node}",
                        rotation=90,
                        ha="left",
                        va="center",
                        fontsize=8,
                    )
                elif r1 == pp:  # part of the last row: label below
                    ax.text(
                        (c0 + c1) / 2, -r1 - 0.12, f"node {node}", ha="center", va="top", fontsize=8
                    )
            else:
                for c, r in cells:
                    ax.add_patch(
                        Rectangle(
                            (c + 0.06, -r - 0.94),
                            0.88,
                            0.88,
                            fill=False,
                            edgecolor="black",
                            linestyle="--",
                        )
                    )
        for stage in range(pp):
            ax.text(-0.1, -stage - 0.5, f"stage {stage}", ha="right", va="center", fontsize=8)
        ax.set_xlim(-1.2, per_stage + 0.6)
        ax.set_ylim(-pp - 0.6, 0.2)
        ax.set_aspect("equal")
        ax.axis("off")
        sizes = {len(g) for g in groups[kind]}
        ax.set_title(
            f"{_KIND_TITLES.get(kind, kind)}\n{len(groups[kind])} groups of "
            f"{'/'.join(map(str, sorted(sizes)))}",
            fontsize=9,
        )
    fig.suptitle(
        f"{world_size} ranks, t = {tp}, p = {pp}, d = {world_size // (tp * pp)}; "
        f"nodes of {gpus_per_node} GPUs dashed",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def plot_comm_seconds(
    rows: Mapping[str, Mapping[str, float]], compute_s: float | None = None, title: str = ""
) -> Figure:
    """Horizontal bars of seconds per step, {what: {link: seconds}} (e.g. TP's all-reduces
    over NVLink and over the inter-node network, DP's beside them); `compute_s`, the compute
    per step, as a dashed line to compare with."""
    labels = [(what, link, sec) for what, links in rows.items() for link, sec in links.items()]
    links = list(dict.fromkeys(link for _, link, _ in labels))
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(labels) + 1.4))
    ys = list(range(len(labels)))[::-1]
    for y, (_, link, sec) in zip(ys, labels):
        ax.barh(y, sec, 0.7, color=_CMAP(links.index(link)))
        ax.text(sec, y, f" {sec:.2f} s", va="center", fontsize=8)
    ax.set_yticks(ys, [f"{what}, {link}" for what, link, _ in labels], fontsize=8)
    if compute_s is not None:
        ax.axvline(compute_s, color="black", linestyle="--", linewidth=1)
        ax.text(
            compute_s,
            max(ys) + 0.5,
            f"compute {compute_s:.1f} s ",
            ha="right",
            va="bottom",
            fontsize=8,
        )
    ax.set_xlabel("seconds per step and GPU (α-β model)")
    ax.set_ylim(-0.6, max(ys) + 1.1)
    ax.margins(x=0.12)
    ax.set_title(title or "communication time per step", fontsize=10)
    fig.tight_layout()
    return fig
