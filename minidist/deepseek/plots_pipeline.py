"""Pictures for DualPipe (DeepSeek-V3, arXiv:2412.19437, section 3.2.1; notebook 19).

- `plot_overlapped_pair`: Figure 4, one forward chunk and one backward chunk overlapped on a
  compute and a communication stream (`dualpipe.overlapped_pair`).
- `plot_dual_schedule`: DualPipe's (Figure 5) or DualPipeV's per-rank schedule on lesson
  09's simulator and Gantt chart, each overlapped pair outlined in black as in the paper.

Every function returns a matplotlib Figure and shows nothing itself.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from ..pipeline.plots import OP_COLORS, OP_NAMES, plot_gantt
from ..pipeline.schedules import steps_together
from ..pipeline.simulate import simulate
from .dualpipe import Segment, serial_time

PP_COLOR = "#8172b2"  # the paper's purple for pipeline sends


def plot_overlapped_pair(segments: list[Segment], title: str = "") -> Figure:
    """Two rows, computation over communication; the all-to-alls hatched in their chunk's
    colour (forward or backward), the pipeline sends in purple."""
    fig, ax = plt.subplots(figsize=(9, 2.4))
    rows = {"compute": 1, "communication": 0}
    for seg in segments:
        color = PP_COLOR if seg.part == "pp" else OP_COLORS[seg.op]
        comm = seg.stream == "communication" and seg.part != "pp"
        ax.broken_barh(
            [(seg.start, seg.end - seg.start)],
            (rows[seg.stream] - 0.4, 0.8),
            facecolors=color,
            edgecolor="white",
            hatch="//" if comm else None,
            alpha=0.75 if comm else 1.0,
        )
        if seg.part != "pp":
            ax.text(
                (seg.start + seg.end) / 2,
                rows[seg.stream],
                f"{seg.part.upper()}\n({seg.op})",
                ha="center",
                va="center",
                fontsize=7,
                color="white",
            )
    span = max(s.end for s in segments)
    ax.set_yticks([0, 1])
    ax.set_yticklabels(["communication", "computation"])
    ax.set_xlim(0, span * 1.01)
    ax.set_xlabel("time units")
    handles = [Patch(color=OP_COLORS[o], label=OP_NAMES[o]) for o in "FBW"]
    handles.append(Patch(color=PP_COLOR, label="pipeline send"))
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.35),
        ncol=4,
        fontsize=8,
        frameon=False,
    )
    name = f"{title} · " if title else ""
    ax.set_title(
        f"{name}{span:g} overlapped against {serial_time(segments):g} one after the other",
        fontsize=10,
    )
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig


def plot_dual_schedule(
    steps: list[list[tuple]],
    placement: str = "dual",
    forward: float = 1.0,
    backward: float = 1.0,
    weight: float = 1.0,
    paired: float | None = None,
    title: str = "",
) -> Figure:
    """`steps` from `dualpipe.dualpipe` (placement "dual": chunk = direction, the reverse one
    lighter) or `schedule("dualpipev", ...)` (placement "v"), simulated with lesson 09's
    costs (`backward` the input gradient's) and `paired` for an overlapped pair."""
    timeline = simulate(steps, forward, backward, weight, placement=placement, paired=paired)
    fig = plot_gantt(timeline, title=title, row="rank")
    ax = fig.axes[0]
    p = len(timeline.stages)
    for s, ran in enumerate(timeline.stages):
        k = 0
        while k < len(ran):
            n = steps_together([step for step, _, _ in ran], k)
            if n > 1:
                start, end = ran[k][1], ran[k + n - 1][2]
                ax.add_patch(
                    Rectangle(
                        (start, p - 1 - s - 0.42),
                        end - start,
                        0.84,
                        fill=False,
                        edgecolor="black",
                        linewidth=1.2,
                    )
                )
            k += n
    return fig
