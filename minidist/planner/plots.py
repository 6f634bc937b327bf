"""Lesson 13's pictures."""

from __future__ import annotations

from matplotlib.figure import Figure

from .plan import Plan, frontier

GIB = 1024**3


def plot_sweep(plans: list[Plan], memory_bytes: float | None = None) -> Figure:
    """Memory per rank against step time, one point per layout; the layouts no other beats
    on both (the feasible frontier) joined; the memory budget as a line."""
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    fits = [p for p in plans if memory_bytes is None or p.fits(memory_bytes)]
    over = [p for p in plans if p not in fits]
    for group, style in ((fits, dict(color="C0")), (over, dict(color="0.7"))):
        ax.scatter(
            [p.time.total_s for p in group], [p.memory_per_rank / GIB for p in group], **style
        )
    front = frontier(fits) if fits else []
    for p in front:  # label the frontier only: a sweep has dozens of points
        lay = p.layout
        ax.annotate(
            f"d{lay.dp} t{lay.tp} p{lay.pp} z{lay.zero}", (p.time.total_s, p.memory_per_rank / GIB),
            fontsize=7, xytext=(3, 3), textcoords="offset points",
        )  # fmt: skip
    if front:
        ax.plot(
            [p.time.total_s for p in front], [p.memory_per_rank / GIB for p in front],
            color="C3", label="feasible frontier",
        )  # fmt: skip
    if memory_bytes is not None:
        ax.axhline(memory_bytes / GIB, color="k", ls="--", lw=1, label="memory per device")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted step time (s)")
    ax.set_ylabel("memory per rank (GiB)")
    ax.legend(loc="upper right")
    return fig
