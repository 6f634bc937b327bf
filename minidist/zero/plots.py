"""Pictures for ZeRO (notebook 02): where the bytes of a rank go, and how they shrink with N.

- `plot_memory_by_state`: per stage 0-3, a stacked bar of parameters / gradients / optimizer
  state per rank from the formula, and beside it the bar measured on a real rank where one
  is given (Rajbhandari et al. 2020, "ZeRO", section 5 and Figure 1).
- `plot_memory_vs_world`: memory per rank against N for each stage, from the formula
  (`theory.memory_per_device`), with measured points where given.
- `plot_flat_shard`: a flat buffer of parameters padded to a multiple of N, cut into N equal
  chunks, one per rank (`FlatShard`); padding hatched.

Every function returns a matplotlib Figure and shows nothing itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from . import theory
from .flat import FlatShard

STATES = ("params", "grads", "optimizer")
_STATE_COLORS = {"params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868"}
_STATE_LABELS = {"params": "parameters", "grads": "gradients", "optimizer": "optimizer state"}
_STAGE_COLORS = {0: "#c44e52", 1: "#dd8452", 2: "#55a868", 3: "#4c72b0"}
_STAGE_NAMES = {
    0: "stage 0 (DP)",
    1: "stage 1 (P_os)",
    2: "stage 2 (P_os+g)",
    3: "stage 3 (P_os+g+p)",
}


def plot_memory_by_state(
    formula: Mapping[int, Mapping[str, float]],
    measured: Mapping[int, Mapping[str, float]] | None = None,
    title: str = "",
    unit: tuple[str, float] = ("KiB", 1024),
) -> Figure:
    """For each stage of `formula` ({stage: {params, grads, optimizer}} in bytes), a stacked
    bar from the formula and, where `measured` has that stage, the measured bar beside it."""
    measured = measured or {}
    name, scale = unit
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.38
    ticks = []
    for i, stage in enumerate(sorted(formula)):
        if stage in measured:
            bars = [("formula", formula[stage], i - width / 2)]
            bars.append(("measured", measured[stage], i + width / 2))
        else:
            bars = [("formula", formula[stage], i)]
        for kind, values, x in bars:
            bottom = 0.0
            for state in STATES:
                height = values[state] / scale
                ax.bar(
                    x,
                    height,
                    width,
                    bottom=bottom,
                    color=_STATE_COLORS[state],
                    alpha=0.45 if kind == "formula" else 1.0,
                    hatch="//" if kind == "formula" else None,
                    edgecolor="black",
                    linewidth=0.5,
                )
                bottom += height
            ax.text(x, bottom, f"{kind}\n{bottom:.0f}", ha="center", va="bottom", fontsize=7)
        ticks.append((i, _STAGE_NAMES.get(stage, f"stage {stage}")))
    ax.set_xticks([t for t, _ in ticks], [label for _, label in ticks], fontsize=8)
    ax.set_ylabel(f"model states per rank ({name})")
    handles = [Patch(color=_STATE_COLORS[s], label=_STATE_LABELS[s]) for s in STATES]
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="formula"))
    ax.legend(handles=handles, fontsize=8, loc="upper right")
    ax.set_title(title or "memory per rank by state type")
    ax.margins(y=0.2)
    fig.tight_layout()
    return fig


def plot_memory_vs_world(
    num_params: float,
    world_sizes: Sequence[int],
    measured: Mapping[int, Mapping[int, float]] | None = None,
    stages: Sequence[int] = theory.STAGES,
    k: float = 12,
    param_bytes: float = 2,
    grad_bytes: float = 2,
    unit: tuple[str, float] = ("GB", 1e9),
    device_bytes: float | None = None,
    title: str = "",
) -> Figure:
    """Memory per rank against N (log2 axis) for each stage, from `theory.memory_per_device`
    with these byte counts; `measured` ({stage: {N: bytes}}) adds points; `device_bytes` a
    horizontal line (what one device holds)."""
    measured = measured or {}
    name, scale = unit
    fig, ax = plt.subplots(figsize=(7, 4))
    for stage in stages:
        ys = [
            theory.memory_per_device(num_params, n, stage, k, param_bytes, grad_bytes) / scale
            for n in world_sizes
        ]
        ax.plot(world_sizes, ys, "-", color=_STAGE_COLORS[stage], label=_STAGE_NAMES[stage])
        points = measured.get(stage, {})
        if points:
            ax.plot(
                list(points),
                [v / scale for v in points.values()],
                "o",
                color=_STAGE_COLORS[stage],
                markeredgecolor="black",
                label=f"stage {stage} measured",
            )
    if device_bytes is not None:
        ax.axhline(device_bytes / scale, color="gray", linestyle="--", linewidth=1)
        label = f" one device: {device_bytes / scale:g} {name}"
        ax.text(world_sizes[0], device_bytes / scale, label, va="bottom", fontsize=8, color="gray")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(world_sizes), [str(n) for n in world_sizes])
    ax.set_xlabel("N (data-parallel ranks)")
    ax.set_ylabel(f"model states per rank ({name})")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title(title or "memory per rank against N")
    fig.tight_layout()
    return fig


def plot_flat_shard(
    shapes: Sequence[Sequence[int]],
    world_size: int,
    names: Sequence[str] | None = None,
    title: str = "",
) -> Figure:
    """The flat padded buffer of parameters of `shapes`: one cell per element, coloured by
    parameter, padding hatched, a thick line between ranks' chunks, the owner below each."""
    layout = FlatShard([torch.empty(tuple(s), device="cpu") for s in shapes], world_size, 0)
    names = list(names) if names is not None else [f"p{i}" for i in range(len(shapes))]
    cmap = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(max(4.0, 0.42 * layout.padded + 1.5), 1.9))
    for i, (off, n) in enumerate(zip(layout.offsets, layout.numels)):
        for j in range(off, off + n):
            ax.add_patch(Rectangle((j, 0), 1, 1, facecolor=cmap(i % 10), edgecolor="white"))
        ax.text(off + n / 2, 1.1, names[i], ha="center", va="bottom", fontsize=8)
    for j in range(layout.numel, layout.padded):
        ax.add_patch(Rectangle((j, 0), 1, 1, facecolor="white", edgecolor="gray", hatch="///"))
    for r in range(world_size):
        start = r * layout.chunk
        if r:
            ax.plot([start, start], [-0.05, 1.05], color="black", linewidth=2.5)
        ax.text(start + layout.chunk / 2, -0.15, f"r{r}", ha="center", va="top", fontsize=7)
    ax.set_xlim(-0.2, layout.padded + 0.2)
    ax.set_ylim(-0.7, 1.6)
    ax.axis("off")
    ax.set_title(
        title
        or f"{layout.numel} elements, padded to {layout.padded} = {world_size} chunks of "
        f"{layout.chunk} (padding hatched)",
        fontsize=9,
    )
    fig.tight_layout()
    return fig
