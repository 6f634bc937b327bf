"""Pictures for offload (notebook 05): where each state lives, what crosses the bus.

- `plot_tiers`: for each placement (on the device, CPU offload, disk offload), one rank's
  bytes in each tier (device / host / disk), stacked by kind of state (parameters,
  gradients, optimizer state), measured beside the formula (`theory.tier_bytes`).
- `plot_bytes_moved`: bytes moved per step between tiers, measured beside the theory
  (`theory.bytes_moved_per_step`, `theory.disk_bytes_per_step`); a direction nothing
  measures is drawn from the theory alone and says so.
- `plot_disk_files`: the disk tier's files and their sizes on disk.
- `plot_placement_options`: ZeRO-Offload's candidate placements (section 3) as GPU bytes
  against bytes over the bus per step.

Every function returns a matplotlib Figure and shows nothing itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .theory import STATES, TIERS

_STATE_COLORS = {"params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868"}
_STATE_LABELS = {
    "params": "parameters (host: fp32 masters)",
    "grads": "gradients",
    "optimizer": "optimizer state",
}
_DIRECTIONS = {
    "device_to_host": "device → host\n(gradients)",
    "host_to_device": "host → device\n(parameters)",
    "disk_to_host": "disk → host\n(Adam's moments)",
    "host_to_disk": "host → disk\n(Adam's moments)",
}

Tiers = Mapping[str, Mapping[str, float]]  # {tier: {state: bytes}}


def _stack(ax, x: float, width: float, states: Mapping[str, float], scale: float, formula: bool):
    bottom = 0.0
    for state in STATES:
        height = states.get(state, 0) / scale
        if height:
            ax.bar(
                x,
                height,
                width,
                bottom=bottom,
                color=_STATE_COLORS[state],
                alpha=0.45 if formula else 1.0,
                hatch="//" if formula else None,
                edgecolor="black",
                linewidth=0.5,
            )
        bottom += height
    return bottom


def plot_tiers(
    measured: Mapping[str, Tiers],
    formula: Mapping[str, Tiers] | None = None,
    title: str = "",
    unit: tuple[str, float] = ("KiB", 1024),
) -> Figure:
    """One panel per placement of `measured` ({label: {tier: {state: bytes}}}): a stacked bar
    per tier, and the formula's bar (hatched) beside it where `formula` has that label."""
    formula = formula or {}
    name, scale = unit
    fig, axes = plt.subplots(1, len(measured), figsize=(3.6 * len(measured), 3.8), sharey=True)
    axes = [axes] if len(measured) == 1 else list(axes)
    width = 0.38
    for ax, (label, tiers) in zip(axes, measured.items()):
        for i, tier in enumerate(TIERS):
            bars = [("measured", tiers.get(tier, {}), i)]
            if label in formula:
                bars = [("formula", formula[label].get(tier, {}), i - width / 2)]
                bars.append(("measured", tiers.get(tier, {}), i + width / 2))
            for kind, states, x in bars:
                top = _stack(ax, x, width, states, scale, kind == "formula")
                if top:
                    ax.text(x, top, f"{top:.0f}", ha="center", va="bottom", fontsize=7)
            if not any(sum(s.values()) for _, s, _ in bars):
                ax.text(i, 0, "0", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(TIERS)), TIERS)
        ax.set_xlim(-0.6, len(TIERS) - 0.4)
        ax.set_title(label, fontsize=10)
        ax.margins(y=0.15)
    axes[0].set_ylabel(f"bytes per rank ({name})")
    handles = [Patch(color=_STATE_COLORS[s], label=_STATE_LABELS[s]) for s in STATES]
    if formula:
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="formula"))
    fig.legend(handles=handles, fontsize=8, loc="lower center", ncol=len(handles))
    fig.suptitle(title or "where each state lives, per rank", fontsize=11)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def plot_bytes_moved(
    measured: Mapping[str, Mapping[str, float]],
    theory: Mapping[str, Mapping[str, float]],
    title: str = "",
    unit: tuple[str, float] = ("KiB", 1024),
) -> Figure:
    """Bytes per step in each direction, for each placement: `theory` ({label: {direction:
    bytes}}) hatched, `measured` (same shape) solid beside it; a direction `measured` lacks
    is labelled "theory only"."""
    name, scale = unit
    directions = [d for d in _DIRECTIONS if any(d in t for t in theory.values())]
    labels = list(theory)
    cmap = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(2.2 * len(directions) + 2, 3.8))
    group = 0.8 / max(1, len(labels))
    for j, label in enumerate(labels):
        color = cmap(j + 1)
        for i, d in enumerate(directions):
            if d not in theory[label]:
                continue
            x = i - 0.4 + group * (j + 0.5)
            want = theory[label][d] / scale
            got = measured.get(label, {}).get(d)
            if got is None:
                ax.bar(
                    x,
                    want,
                    group * 0.9,
                    color=color,
                    alpha=0.35,
                    hatch="//",
                    edgecolor="black",
                    linewidth=0.5,
                )
                ax.text(x, want, f"{want:.0f}\ntheory only", ha="center", va="bottom", fontsize=7)
                continue
            ax.bar(
                x - group / 4,
                want,
                group / 2,
                color=color,
                alpha=0.35,
                hatch="//",
                edgecolor="black",
                linewidth=0.5,
            )
            ax.bar(
                x + group / 4, got / scale, group / 2, color=color, edgecolor="black", linewidth=0.5
            )
            ax.text(
                x,
                max(want, got / scale),
                f"{got / scale:.0f}",
                ha="center",
                va="bottom",
                fontsize=7,
            )
    ax.set_xticks(range(len(directions)), [_DIRECTIONS[d] for d in directions], fontsize=8)
    ax.set_ylabel(f"bytes per rank per step ({name})")
    handles = [Patch(color=cmap(j + 1), label=label) for j, label in enumerate(labels)]
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="theory"))
    ax.legend(handles=handles, fontsize=8)
    ax.margins(y=0.2)
    ax.set_title(title or "bytes moved per step between tiers")
    fig.tight_layout()
    return fig


def plot_disk_files(
    sizes: Mapping[str, int],
    owned: Sequence[int] | None = None,
    title: str = "",
) -> Figure:
    """One horizontal bar per file of the disk tier (its size on disk, bytes); with `owned`
    (elements of each stepped tensor, in file order) a tick at 4 bytes per element."""
    names = list(sizes)
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(names) + 1.2))
    colors = ["#55a868" if n.endswith("exp_avg") else "#8172b2" for n in names]
    ax.barh(
        range(len(names)), [sizes[n] for n in names], color=colors, edgecolor="black", linewidth=0.5
    )
    for i, n in enumerate(names):
        ax.text(sizes[n], i, f" {sizes[n]} B", va="center", fontsize=8)
        if owned is not None:
            want = 4 * owned[int(n.split(".")[0])]
            ax.plot([want, want], [i - 0.4, i + 0.4], color="black", linewidth=2)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("size on disk (bytes)" + ("; tick: 4 bytes × elements" if owned else ""))
    ax.margins(x=0.2)
    ax.set_title(title or "the disk tier's files", fontsize=10)
    fig.tight_layout()
    return fig


def plot_placement_options(rows: Sequence[Mapping], num_params: float, title: str = "") -> Figure:
    """`theory.placement_options` rows as points: bytes per parameter kept on the GPU against
    bytes per parameter over the bus per step; open markers where forward and backward run
    on the CPU."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, r in enumerate(rows):
        gpu, bus = r["gpu_bytes"] / num_params, r["bus_bytes"] / num_params
        on_gpu = r["forward_backward"] == "gpu"
        label = r["placement"] + ("" if on_gpu else " (forward/backward on CPU)")
        ax.plot(
            gpu,
            bus,
            "o",
            markersize=9,
            color=plt.get_cmap("tab10")(i),
            markerfacecolor=None if on_gpu else "white",
            markeredgewidth=2,
            label=label,
        )
    ax.set_xlabel("bytes per parameter on the GPU (Ψ)")
    ax.set_ylabel("bytes per parameter over the bus per step (Ψ)")
    ax.set_xlim(-1, 17)
    ax.set_ylim(-1, max(r["bus_bytes"] / num_params for r in rows) + 2)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title(title or "mixed-precision Adam: where the states live (ZeRO-Offload §3)")
    fig.tight_layout()
    return fig
