"""Pictures for pipeline parallelism (notebook 09).

- `plot_gantt`: a Timeline (simulated by `simulate.simulate`, or measured: `from_timestamps`)
  as a Gantt chart, one row per stage, F / B / W boxes labelled with their micro-batch and
  coloured by op (interleaved chunks: a lighter shade per chunk), the idle time left white.
  Huang et al. 2019 (GPipe), Figure 2; Narayanan et al. 2021, Figures 3-4; Qi et al. 2024.
- `plot_measured_gantt`: the same from the (op, microbatch, start, end) lists that
  `PipelineParallel.timings` recorded on each rank of a real run, in milliseconds.
- `plot_bubble_vs_m`: the bubble against the number of micro-batches m, simulated points next
  to `theory.bubble_fraction` for GPipe / 1F1B, interleaved 1F1B and ZB-H1.
- `plot_activation_memory`: saved-activation bytes per stage, measured next to the formula,
  for several schedules.

Every function returns a matplotlib Figure and shows nothing itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from . import theory
from .schedules import schedule
from .simulate import Timeline, from_timestamps, simulate

OP_COLORS = {"F": "#4c72b0", "B": "#55a868", "W": "#c44e52"}
OP_NAMES = {"F": "forward", "B": "backward", "W": "weight gradient"}


def _shade(color: str, chunk: int) -> tuple:
    """Chunk 0 in the op's colour, each later chunk lighter."""
    r, g, b = to_rgb(color)
    k = min(0.55, 0.35 * chunk)
    return (r + (1 - r) * k, g + (1 - g) * k, b + (1 - b) * k)


def plot_gantt(
    timeline: Timeline,
    title: str = "",
    unit: str = "time units",
    scale: float = 1.0,
    row: str = "stage",
) -> Figure:
    """One row per stage (stage 0 on top); each step a box labelled with its micro-batch.

    `scale` multiplies every time (1e3 draws seconds as milliseconds); `row` names a row."""
    p = len(timeline.stages)
    span = timeline.makespan * scale
    fig, ax = plt.subplots(figsize=(max(7.0, min(14.0, 0.45 * span + 3)), 0.55 * p + 1.4))
    label_min = span / 60  # boxes narrower than this stay unlabelled
    ops = set()
    for s, steps in enumerate(timeline.stages):
        y = p - 1 - s
        for step, start, end in steps:
            op, i = step[0], step[1]
            chunk = step[2] if len(step) > 2 else 0
            ops.add(op)
            x0, w = start * scale, (end - start) * scale
            ax.broken_barh(
                [(x0, w)],
                (y - 0.4, 0.8),
                facecolors=_shade(OP_COLORS[op], chunk),
                edgecolor="white",
                linewidth=0.8,
            )
            if w >= label_min:
                ax.text(
                    x0 + w / 2,
                    y,
                    str(i),
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if chunk == 0 else "black",
                )
    ax.set_yticks(range(p))
    ax.set_yticklabels([f"{row} {p - 1 - y}" for y in range(p)])
    ax.set_xlim(0, span * 1.01)
    ax.set_xlabel(unit)
    handles = [Patch(color=OP_COLORS[o], label=OP_NAMES[o]) for o in "FBW" if o in ops]
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.28),
        ncol=3,
        fontsize=8,
        frameon=False,
    )
    ax.set_title(f"{title}{' · ' if title else ''}bubble {timeline.bubble:.1%}", fontsize=10)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig


def plot_measured_gantt(timings: Sequence[Sequence[tuple]], title: str = "") -> Figure:
    """The Gantt chart of a real run: `timings[r]` is rank r's `PipelineParallel.timings`."""
    return plot_gantt(from_timestamps(timings), title=title, unit="milliseconds", scale=1e3)


def plot_bubble_vs_m(
    stages: int = 4, ms: Sequence[int] = (4, 8, 12, 16, 24, 32), virtual: int = 2
) -> Figure:
    """Bubble against m: simulated points (F = B = 1; ZB-H1: F = B = W = 1) on the formulas."""
    fig, ax = plt.subplots(figsize=(7, 4))
    cases = [
        ("gpipe", 1, "GPipe", "o", {}),
        ("1f1b", 1, "1F1B", "x", {}),
        ("interleaved", virtual, f"interleaved 1F1B, v = {virtual}", "s", {}),
        ("zb-h1", 1, "ZB-H1 (F = B = W)", "^", {"weight": 1.0}),
    ]
    dense = [m / 4 for m in range(4, 4 * max(ms) + 1)]
    for n, (kind, v, label, marker, costs) in enumerate(cases):
        color = plt.get_cmap("tab10")(n)
        points = [m for m in ms if kind != "interleaved" or m % stages == 0]
        sim = [simulate(schedule(kind, stages, m, v), **costs).bubble for m in points]
        ax.scatter(points, sim, marker=marker, color=color, label=f"{label}: simulated", zorder=3)
        if kind != "1f1b":  # 1F1B's formula is GPipe's
            name = "GPipe and 1F1B" if kind == "gpipe" else label
            ax.plot(
                dense,
                [theory.bubble_fraction(stages, m, kind, v) for m in dense],
                color=color,
                linewidth=1,
                alpha=0.7,
                label=f"{name}: formula",
            )
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("bubble (idle share)")
    ax.set_title(f"p = {stages} stages: the bubble shrinks with m", fontsize=10)
    ax.set_ylim(0, None)
    ax.legend(fontsize=7)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig


def plot_activation_memory(
    measured: Mapping[str, Sequence[int]], formula: Mapping[str, Sequence[int]]
) -> Figure:
    """Saved-activation bytes per stage: bars for the formula, points for the measurement,
    one group of bars per schedule (`measured[kind][stage]`)."""
    kinds = list(measured)
    p = len(next(iter(measured.values())))
    fig, ax = plt.subplots(figsize=(7, 3.8))
    width = 0.8 / len(kinds)
    for k, kind in enumerate(kinds):
        xs = [s + (k - (len(kinds) - 1) / 2) * width for s in range(p)]
        ax.bar(xs, [b / 1024 for b in formula[kind]], width, alpha=0.6, label=f"{kind}: formula")
        ax.scatter(
            xs,
            [b / 1024 for b in measured[kind]],
            color="black",
            marker="x",
            zorder=3,
            label="measured" if k == 0 else None,
        )
    ax.set_xticks(range(p))
    ax.set_xticklabels([f"stage {s}" for s in range(p)])
    ax.set_ylabel("peak saved activations (KiB)")
    ax.set_title("activation memory per stage", fontsize=10)
    ax.legend(fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig
