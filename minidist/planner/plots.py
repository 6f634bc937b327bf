"""Lesson 13's pictures."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

from .plan import Plan, frontier

GIB = 1024**3


def plot_sweep(
    plans: list[Plan], memory_bytes: float | None = None, highlight: Plan | None = None
) -> Figure:
    """Memory per rank against step time, one point per layout; the layouts no other beats
    on both (the feasible frontier) joined and labelled; the memory budget as a line; the
    `highlight` plan (e.g. the one chosen) ringed."""
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    fits = [p for p in plans if memory_bytes is None or p.fits(memory_bytes)]
    over = [p for p in plans if p not in fits]
    for group, style in ((fits, dict(color="C0")), (over, dict(color="0.7"))):
        ax.scatter(
            [p.time.total_s for p in group], [p.memory_per_rank / GIB for p in group], **style
        )
    front = frontier(fits) if fits else []
    names = []
    for i, p in enumerate(front, 1):  # number the frontier's points, named beside the axes
        lay = p.layout  # (a sweep has dozens of points; the frontier's sit close together)
        ax.annotate(
            str(i),
            (p.time.total_s, p.memory_per_rank / GIB),
            fontsize=7,
            color="C3",
            xytext=(3, 3),
            textcoords="offset points",
        )
        names.append(f"{i}: d{lay.dp} t{lay.tp} p{lay.pp} z{lay.zero}")
    if names:
        ax.text(
            1.02,
            1.0,
            "feasible frontier\n" + "\n".join(names),
            transform=ax.transAxes,
            va="top",
            fontsize=7,
            family="monospace",
        )
    if front:
        ax.plot(
            [p.time.total_s for p in front],
            [p.memory_per_rank / GIB for p in front],
            color="C3",
            label="feasible frontier",
        )
    if highlight is not None and highlight.time is not None:
        ax.scatter(
            [highlight.time.total_s],
            [highlight.memory_per_rank / GIB],
            s=160,
            facecolors="none",
            edgecolors="C3",
            linewidths=2,
            label="chosen",
        )
    if memory_bytes is not None:
        ax.axhline(memory_bytes / GIB, color="k", ls="--", lw=1, label="memory per device")
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):  # plain numbers at 1, 2 and 5 of each decade, so a
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))  # range inside one decade
        axis.set_major_formatter(ScalarFormatter())  # still has several labels
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("predicted step time (s)")
    ax.set_ylabel("memory per rank (GiB)")
    ax.legend(loc="upper right")
    return fig
