"""Pictures for activation recomputation (notebook 06).

- `plot_saved_by_part`: bytes a forward saves for backward, part by part (embeddings, each
  block, final norm, head, loss), without and with every block recomputed (measured).
- `plot_segment_peaks`: Chen et al.'s peak ⌈L/k⌉·M_in + k·M_act against the segment length k for
  several L (lines, `theory.saved_bytes`), the best k marked, and the peaks measured over a
  whole step (points; `theory.chain_peak_bytes` is their exact count, dotted).
- `plot_time_memory`: forward and backward time with and without recomputation, and each
  setting's peak of saved bytes against its step time: the trade.

Every function returns a matplotlib Figure and shows nothing itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from . import theory

_PLAIN, _RECOMPUTED = "#c44e52", "#4c72b0"
_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#8172b3", "#937860")


def plot_saved_by_part(
    plain: Mapping[str, int],
    recomputed: Mapping[str, int],
    title: str = "",
    unit: tuple[str, float] = ("KiB", 1024),
) -> Figure:
    """Bars per part of the model: bytes saved without (`plain`) and with recomputation."""
    name, scale = unit
    parts = list(plain)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(parts) + 1), 3.8))
    width = 0.4
    for i, part in enumerate(parts):
        for dx, values, color in (
            (-width / 2, plain, _PLAIN),
            (width / 2, recomputed, _RECOMPUTED),
        ):
            v = values.get(part, 0) / scale
            ax.bar(i + dx, v, width, color=color, edgecolor="black", linewidth=0.5)
            ax.text(
                i + dx,
                v,
                f"{v:.0f}" if v >= 10 else f"{v:.2g}",
                ha="center",
                va="bottom",
                fontsize=6,
            )
    total_p, total_r = sum(plain.values()) / scale, sum(recomputed.values()) / scale
    handles = [
        Patch(color=_PLAIN, label=f"without recomputation: {total_p:.0f} {name} in all"),
        Patch(color=_RECOMPUTED, label=f"every block recomputed: {total_r:.0f} {name} in all"),
    ]
    ax.set_xticks(range(len(parts)), parts, fontsize=8, rotation=30, ha="right")
    ax.set_ylabel(f"saved for backward ({name})")
    ax.legend(handles=handles, fontsize=8)
    ax.set_title(title or "bytes saved in forward, by part", fontsize=10)
    ax.margins(y=0.15)
    fig.tight_layout()
    return fig


def plot_segment_peaks(
    panels: Sequence[Mapping], unit: tuple[str, float] = ("KiB", 1024)
) -> Figure:
    """One panel per mapping: `title`, `activation` M_act and `boundary` M_in (bytes per layer),
    `layers` (the L to draw) and optionally `measured` ({L: {k: peak bytes}}).

    Lines: Chen et al.'s peak against k; stars: the best k of each line, labelled with its
    L; points: measured;
    dotted: `theory.chain_peak_bytes`, the exact count the points follow.
    """
    name, scale = unit
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        a, b = panel["activation"], panel["boundary"]
        measured = panel.get("measured", {})
        for i, (color, layers) in enumerate(zip(_COLORS, panel["layers"])):
            ks = list(range(1, layers + 1))
            chen = [theory.saved_bytes(layers, a, b, k)["peak"] / scale for k in ks]
            ax.plot(ks, chen, "-", color=color, label=f"L = {layers}: ⌈L/ℓ⌉·M_in + ℓ·M_act")
            best = theory.best_segment(layers, a, b)
            # stars of nearby lines can sit almost on one another (k = 1 for L = 4 and 8):
            # each a size smaller than the last, and labelled beside it at its own height
            ax.plot(
                [best],
                [chen[best - 1]],
                "*",
                color=color,
                markersize=14 - 3 * i,
                markeredgecolor="black",
                zorder=3 + i,
            )
            ax.annotate(
                f"L={layers}",
                (best, chen[best - 1]),
                xytext=(9, 6 - 9 * i),
                textcoords="offset points",
                fontsize=7,
                color=color,
            )
            points = measured.get(layers, {})
            if points:
                exact = [theory.chain_peak_bytes(layers, a, b, k) / scale for k in ks]
                ax.plot(ks, exact, ":", color=color, linewidth=1)
                ax.plot(
                    list(points),
                    [v / scale for v in points.values()],
                    "o",
                    color=color,
                    markeredgecolor="black",
                    markersize=5,
                )
            plain = layers * a / scale
            ax.axhline(plain, color=color, linestyle="--", linewidth=0.7)
        ax.plot([], [], "o", color="gray", markeredgecolor="black", label="measured (one step)")
        ax.plot([], [], "*", color="gray", markeredgecolor="black", markersize=11, label="best ℓ")
        ax.plot([], [], "--", color="gray", linewidth=0.7, label="no recomputation, L·M_act")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("segment length ℓ (layers per recomputed segment)")
        ax.set_ylabel(f"peak of saved activations ({name})")
        ax.set_title(panel.get("title", ""), fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_time_memory(
    settings: Mapping[str, Mapping[str, float]], unit: tuple[str, float] = ("KiB", 1024)
) -> Figure:
    """`settings`: {label: {forward, backward (seconds), peak (bytes)}}. Left: forward and
    backward time per setting; right: each setting's peak saved bytes against step time."""
    name, scale = unit
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    labels = list(settings)
    for i, label in enumerate(labels):
        s = settings[label]
        f, b = 1e3 * s["forward"], 1e3 * s["backward"]
        left.bar(i, f, color="#8c8c8c", edgecolor="black", linewidth=0.5)
        left.bar(i, b, bottom=f, color=_COLORS[i % len(_COLORS)], edgecolor="black", linewidth=0.5)
        left.text(i, f + b, f"{f + b:.1f} ms", ha="center", va="bottom", fontsize=8)
        right.plot(
            f + b,
            s["peak"] / scale,
            "o",
            color=_COLORS[i % len(_COLORS)],
            markeredgecolor="black",
            markersize=8,
        )
        right.annotate(
            label, (f + b, s["peak"] / scale), textcoords="offset points", xytext=(6, 4), fontsize=8
        )
    first = settings[labels[0]]
    one_more = 1e3 * (2 * first["forward"] + first["backward"])
    left.axhline(one_more, color="black", linestyle="--", linewidth=0.8)
    handles = [
        Patch(color="#8c8c8c", label="forward"),
        Patch(
            facecolor="white",
            edgecolor="black",
            label="backward (with any recomputation),\none colour per setting",
        ),
        plt.Line2D(
            [],
            [],
            color="black",
            linestyle="--",
            linewidth=0.8,
            label=f"{labels[0]} + one more forward",
        ),
    ]
    left.set_xticks(range(len(labels)), labels, fontsize=8)
    left.set_ylabel("median time (ms)")
    left.legend(handles=handles, fontsize=8, loc="upper left")
    left.set_title("time of one step", fontsize=10)
    left.set_ylim(0, 1.45 * max(1e3 * (s["forward"] + s["backward"]) for s in settings.values()))
    right.set_xlabel("median step time (ms)")
    right.set_ylabel(f"peak of saved activations ({name})")
    right.set_ylim(bottom=0, top=1.2 * max(s["peak"] for s in settings.values()) / scale)
    right.set_title("the trade: memory against time", fontsize=10)
    right.margins(x=0.25)
    fig.tight_layout()
    return fig
