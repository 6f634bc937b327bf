"""Pictures for lesson 12 (notebook 12: parameter servers and the shape of the network).

- `plot_staleness_histograms`: how stale each applied gradient was, one panel per consistency
  model (BSP, SSP with s = 1, 2, async), the bound s drawn where there is one (Ho et al.
  2013, Figure 3's idea).
- `plot_link_class_bytes`: bytes one rank sends per link class for flat ring, row-inner and
  column-inner all-reduce on a mesh, measured bars next to the formula's marks.
- `plot_alpha_beta_times`: α-β time against message size for each shape, given a link per
  direction (`minidist.network.theory.predict_times`).
- `plot_ps_vs_all_reduce`: bytes per step on the busiest link of a parameter server as S
  grows, next to a worker's and a ring all-reduce's (`theory`).
- `plot_loss_curves`: loss per step of several runs (BSP, SSP s = 1, 3, async, Downpour).
- `plot_cache_resident_bytes`: GeePS's cache during one step, the device tier's bytes per
  layer at each (phase, layer), with the theory's peak.
- `plot_published_times`: α-β time against message size on systems with published link
  figures (`minidist.network.published`), the flat ring's latency/bandwidth crossover marked.

Every function returns a matplotlib Figure and shows nothing itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..network import theory as net_theory
from . import theory

SHAPE_COLORS = {"flat": "#8c8c8c", "row-inner": "#4c72b0", "column-inner": "#dd8452"}
PHASE = {"forward": "fwd", "backward": "bwd"}
CLASS_COLORS = {
    "row": "#4c72b0",
    "column": "#dd8452",
    "world": "#8c8c8c",
    "intra": "#55a868",
    "inter": "#c44e52",
}


def plot_staleness_histograms(
    staleness: Mapping[str, Sequence[int]], bounds: Mapping[str, int | None]
) -> Figure:
    """One histogram per run: `staleness[label]` the applied gradients' staleness, `bounds`
    its s (None: no bound)."""
    n = len(staleness)
    top = max(max(v) for v in staleness.values())
    fig, axes = plt.subplots(1, n, figsize=(3.0 * n, 2.8), sharey=True)
    axes = [axes] if n == 1 else list(axes)
    for ax, (label, values) in zip(axes, staleness.items()):
        bins = [b - 0.5 for b in range(top + 2)]
        ax.hist(values, bins=bins, color="#4c72b0", edgecolor="white")
        bound = bounds.get(label)
        if bound is not None:
            ax.axvline(bound + 0.5, color="#c44e52", linestyle="--", label=f"s = {bound}")
            ax.legend(fontsize=8, frameon=False)
        ax.set_title(f"{label}: max {max(values)}", fontsize=10)
        ax.set_xlabel("staleness (versions)")
        ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))  # 10111213 otherwise
        ax.spines[["top", "right"]].set_visible(False)
    axes[0].set_ylabel("applied gradients")
    fig.tight_layout()
    return fig


def plot_link_class_bytes(
    measured: Mapping[str, Mapping[str, float]], formula: Mapping[str, Mapping[str, float]]
) -> Figure:
    """Stacked bars per all-reduce shape, one colour per link class; black ticks: formula."""
    shapes = list(measured)
    fig, ax = plt.subplots(figsize=(1.6 * len(shapes) + 2.5, 3.2))
    for x, shape in enumerate(shapes):
        bottom = 0.0
        for kind, value in measured[shape].items():
            if not value:
                continue
            ax.bar(
                x,
                value,
                bottom=bottom,
                color=CLASS_COLORS.get(kind, "#999999"),
                label=kind,
                width=0.6,
            )
            expect = formula.get(shape, {}).get(kind)
            if expect is not None:
                ax.plot([x - 0.3, x + 0.3], [bottom + expect] * 2, color="black", linewidth=1.5)
            bottom += value
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(
        unique.values(),
        [f"{k} links" for k in unique],
        fontsize=8,
        frameon=False,
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
    )  # clear of the bars
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels(shapes)
    ax.set_ylabel("bytes sent per rank")
    ax.set_title("bytes per link class (bars measured, ticks: formula)", fontsize=10)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig


def plot_alpha_beta_times(
    rows: int,
    cols: int,
    row: net_theory.Link,
    column: net_theory.Link,
    numels: Sequence[int],
    title: str = "",
    element_size: int = 4,
) -> Figure:
    """Predicted seconds of flat, row-inner and column-inner all-reduce against message size."""
    times = [net_theory.predict_times(n, rows, cols, row, column, element_size) for n in numels]
    sizes = [n * element_size for n in numels]
    fig, ax = plt.subplots(figsize=(6.0, 3.4))
    for shape, color in SHAPE_COLORS.items():
        ax.plot(
            sizes, [t[shape] for t in times], marker="o", markersize=3, color=color, label=shape
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("α-β time (s)")
    ax.set_title(title or f"{rows}×{cols} mesh", fontsize=10)
    ax.legend(fontsize=8, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig


def plot_ps_vs_all_reduce(
    psi: int, workers: int, servers: Sequence[int] | None = None, element_size: int = 4
) -> Figure:
    """Bytes per step received by the busiest server (W·Ψ/S), sent by a worker (Ψ), and sent
    by a rank of a ring all-reduce over the W workers (2(W-1)/W·Ψ), against S."""
    servers = list(servers or range(1, workers + 1))
    busiest = [
        theory.server_bytes_per_step(psi, s, workers, 0, element_size)["received"] for s in servers
    ]
    worker = theory.worker_bytes_per_step(psi, element_size)["pushed"]
    ring = theory.ring_bytes_per_step(psi, workers, element_size)
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    ax.plot(servers, busiest, marker="o", color="#c44e52", label="a server's link: W·Ψ/S")
    ax.axhline(worker, color="#4c72b0", linestyle="--", label="a worker's link: Ψ")
    ax.axhline(ring, color="#55a868", linestyle=":", label="ring all-reduce: 2(W-1)/W·Ψ")
    ax.set_xlabel("servers S")
    ax.set_ylabel("bytes per step, one direction")
    ax.set_title(f"W = {workers} workers, Ψ = {psi} values", fontsize=10)
    ax.set_xticks(servers)
    ax.legend(fontsize=8, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig


def plot_loss_curves(losses: Mapping[str, Sequence[float]], title: str = "") -> Figure:
    """One line per run: its loss per step (e.g. the mean over workers)."""
    fig, ax = plt.subplots(figsize=(5.8, 3.2))
    for label, values in losses.items():
        ax.plot(range(len(values)), values, marker="o", markersize=2.5, label=label)
    ax.set_xlabel("step (clock)")
    ax.set_ylabel("training loss")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig


def plot_cache_resident_bytes(events, layer_bytes: Sequence[int], prefetch: int) -> Figure:
    """Stacked bars, one per (phase, layer) of a step: each resident layer's bytes in the
    device tier; the dashed line is `theory.cache_peak_resident_bytes`."""
    colors = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(1.0 * len(events) + 2.0, 3.2))
    for x, e in enumerate(events):
        bottom = 0
        for j in e.resident_layers:
            ax.bar(
                x,
                layer_bytes[j],
                bottom=bottom,
                color=colors(j % 10),
                width=0.7,
                label=f"layer {j}",
                edgecolor="white",
            )
            bottom += layer_bytes[j]
        if e.moved_in:
            ax.text(x, bottom, f"+{e.moved_in}", ha="center", va="bottom", fontsize=7)
    peak = theory.cache_peak_resident_bytes(list(layer_bytes), prefetch)
    ax.axhline(peak, color="black", linestyle="--", linewidth=1, label="theory: peak")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(
        unique.values(),
        unique.keys(),
        fontsize=7,
        frameon=False,
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
    )
    ax.set_xticks(range(len(events)))
    ax.set_xticklabels([f"{PHASE[e.phase]} {e.layer}" for e in events], fontsize=8)
    ax.set_ylabel("device-tier bytes")
    ax.set_title(
        f"GeePS cache, prefetch {prefetch}: resident layers (+bytes copied in)", fontsize=10
    )
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig


def plot_published_times(systems, sizes: Sequence[float], labels=None) -> Figure:
    """One panel per `minidist.network.published.System`: α-β seconds of each shape against
    message bytes (bf16), the flat ring's latency/bandwidth crossover S* dotted. A shape whose
    times equal an earlier one's (row- and column-inner on a symmetric torus) is drawn dashed
    over it and says so in the legend, so no line hides another."""
    from ..network import published

    labels = labels or {}
    fig, axes = plt.subplots(1, len(systems), figsize=(4.2 * len(systems), 3.3), sharey=True)
    axes = [axes] if len(systems) == 1 else list(axes)
    styles = {
        "flat": ("-", "o", 2.0),
        "row-inner": ("-", "o", 2.5),
        "column-inner": ("--", "x", 1.2),
    }
    for ax, system in zip(axes, systems):
        times = [published.shape_times(system, b) for b in sizes]
        drawn: dict[str, list[float]] = {}
        for shape, color in SHAPE_COLORS.items():
            ys = [t[shape] for t in times]
            same = [
                o
                for o, other in drawn.items()
                if all(abs(a - b) <= 1e-9 * max(a, b) for a, b in zip(ys, other))
            ]
            label = labels.get(shape, shape) + (f" (= {same[0]}, drawn over it)" if same else "")
            line, marker, width = styles.get(shape, ("-", "o", 1.5))
            ax.plot(
                sizes,
                ys,
                color=color,
                linestyle=line,
                marker=marker,
                markersize=3,
                linewidth=width,
                label=label,
            )
            drawn[shape] = ys
        ax.axvline(
            published.latency_bandwidth_crossover(system),
            color="black",
            linestyle=":",
            linewidth=1,
            label="flat ring: S*",
        )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("message (bytes)")
        ax.set_title(system.name, fontsize=10)
        ax.spines[["top", "right"]].set_visible(False)
        ax.legend(fontsize=7, frameon=False)
    axes[0].set_ylabel("α-β time (s)")
    fig.tight_layout()
    return fig
