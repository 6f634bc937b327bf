"""Pictures for FSDP (notebook 03): the flat parameter, a step unit by unit, the peak.

- `plot_flat_param`: a unit's parameters laid out one after another in its flat buffer,
  the zero padding up to a multiple of N, and the equal chunk each rank owns (Zhao et al.
  2023, "PyTorch FSDP", section 3.2.1, whose example is 15 elements on 16 ranks).
- `plot_unit_timeline`: one row per unit for one step on a rank: all-gathers (forward and
  backward; prefetched ones hatched), compute, the moments the full parameter is freed,
  reduce-scatters (on gloo they end when waited for: an upper bound) and the replicas'
  all-reduce with hybrid sharding; one panel per run, e.g. with and without prefetch
  (sections 3.3-3.4). Built from `timeline.record_step`.
- `plot_peak_memory`: peak parameter bytes per rank against the size of the largest unit,
  the formula (`theory.peak_param_bytes`) beside measured points, between the two bounds:
  the shards alone (Σψ/N) and every parameter gathered (what data parallelism holds).

Every function returns a matplotlib Figure and shows nothing itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .theory import padded
from .timeline import StepTimeline

_COMM = {"gather": "#4c72b0", "reduce_scatter": "#c44e52", "replicas": "#8172b3"}
_COMPUTE = {"forward": "#a6a6a6", "backward": "#595959"}


def plot_flat_param(
    numels: Sequence[int],
    world_size: int,
    names: Sequence[str] | None = None,
    title: str = "",
) -> Figure:
    """Top: the flat buffer, one segment per parameter (as wide as its elements), then the
    padding (hatched). Bottom: the chunk of `padded / N` elements each rank owns."""
    names = list(names) if names is not None else [f"p{i}" for i in range(len(numels))]
    total = sum(numels)
    full = padded(total, world_size)
    chunk = full // world_size
    fig, ax = plt.subplots(figsize=(10, 3.2))
    cmap = plt.get_cmap("tab20")
    left, small = 0, 0
    for i, (name, n) in enumerate(zip(names, numels)):
        ax.barh(1, n, left=left, height=0.8, color=cmap(i % 20), edgecolor="black", linewidth=0.5)
        if n > 0.04 * full:  # the label inside, where it fits
            ax.text(left + n / 2, 1, f"{name}\n{n}", ha="center", va="center", fontsize=7)
        else:  # a small parameter: its label above the bar, on one of three levels
            y = 1.55 + 0.3 * (small % 3)
            x = left + n / 2
            ax.plot([x, x], [1.4, y], color="black", linewidth=0.5)
            ax.text(
                x,
                y,
                f" {name} ({n}) ",
                ha="left" if x < 0.8 * full else "right",
                va="center",
                fontsize=6,
            )
            small += 1
        left += n
    if full > total:
        ax.barh(
            1,
            full - total,
            left=total,
            height=0.8,
            color="white",
            hatch="///",
            edgecolor="black",
            linewidth=0.5,
        )
    ranks = plt.get_cmap("tab10" if world_size <= 10 else "tab20")
    for r in range(world_size):
        start = r * chunk
        owned = max(0, min(chunk, total - start))  # elements of parameters, not padding
        ax.barh(
            0,
            chunk,
            left=start,
            height=0.8,
            color=ranks(r % ranks.N),
            alpha=0.75,
            edgecolor="black",
            linewidth=0.5,
        )
        if owned < chunk:
            pad_left = start + owned
            ax.barh(
                0,
                chunk - owned,
                left=pad_left,
                height=0.8,
                color="none",
                hatch="///",
                edgecolor="black",
                linewidth=0.5,
            )
        ax.text(start + chunk / 2, 0, f"r{r}", ha="center", va="center", fontsize=7)
        ax.axvline(start, color="black", linewidth=0.6, linestyle=":")
    ax.set_yticks([1, 0], ["flat parameter", "owner (chunk)"])
    ax.set_xlim(0, full)
    ax.set_ylim(-0.5, 2.4 if small else 1.5)
    ax.set_xlabel(
        f"element ({total} of parameters + {full - total} of padding = {full} "
        f"= {world_size} chunks of {chunk})"
    )
    ax.set_title(title or f"a unit's flat parameter on {world_size} ranks")
    ax.legend(
        handles=[Patch(facecolor="white", edgecolor="black", hatch="///", label="padding (zeros)")],
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=7,
    )
    fig.tight_layout()
    return fig


def _unit_panel(ax, t: StepTimeline) -> None:
    ticks, labels = [], []
    for row, u in enumerate(t.units):
        y = -row
        for start, end, _, prefetched in u.gathers:
            ax.barh(
                y + 0.2,
                1e3 * (end - start),
                left=1e3 * start,
                height=0.35,
                color=_COMM["gather"],
                hatch="///" if prefetched else None,
                edgecolor="black",
                linewidth=0.3,
            )
        for start, end in u.reduce_scatters:
            ax.barh(
                y + 0.2,
                1e3 * (end - start),
                left=1e3 * start,
                height=0.35,
                color=_COMM["reduce_scatter"],
                edgecolor="black",
                linewidth=0.3,
                alpha=0.6,
            )
        for start, end in u.replica_reduces:
            ax.barh(
                y + 0.2,
                1e3 * (end - start),
                left=1e3 * start,
                height=0.35,
                color=_COMM["replicas"],
                edgecolor="black",
                linewidth=0.3,
            )
        for phase in ("forward", "backward"):
            for start, end in getattr(u, phase):
                ax.barh(
                    y - 0.2,
                    1e3 * (end - start),
                    left=1e3 * start,
                    height=0.35,
                    color=_COMPUTE[phase],
                )
        for when in u.frees:
            ax.plot([1e3 * when] * 2, [y - 0.42, y + 0.42], color="black", linewidth=1.4)
        ticks.append(y)
        labels.append(f"{row + 1}. {u.name} ({u.numel:,} elements)")
    for x, label, ha in (
        (t.forward_end, "forward ends ", "right"),
        (t.backward_end, " backward ends", "left"),
    ):
        ax.axvline(1e3 * x, color="black", linestyle="--", linewidth=0.7)
        ax.text(1e3 * x, 0.55, label, fontsize=7, ha=ha, va="bottom")
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.set_ylim(-len(t.units) + 0.4, 0.9)


def plot_unit_timeline(timelines: Mapping[str, StepTimeline], title: str = "") -> Figure:
    """One panel per timeline (`{label: StepTimeline}`), one row per unit numbered in forward
    order: communication above, compute below, a black tick where the full parameter is
    freed. Each panel has its own time axis (the runs take different times)."""
    rows = sum(len(t.units) + 1 for t in timelines.values())
    fig, axes = plt.subplots(len(timelines), 1, figsize=(11, 0.6 + 0.85 * rows), squeeze=False)
    for ax, (label, t) in zip(axes[:, 0], timelines.items()):
        _unit_panel(ax, t)
        ax.set_title(
            f"{label}: step {1e3 * t.step_end:.0f} ms; at most {t.most_units_gathered} units "
            f"gathered at once ({t.peak_gathered_bytes / 1024:.0f} KiB), "
            f"{t.max_gathers_in_flight} all-gather(s) in flight",
            fontsize=9,
        )
    for ax in axes[:, 0]:
        ax.set_xlabel("time since the start of forward (ms)", fontsize=8)
    handles = [
        Patch(color=_COMM["gather"], label="all-gather"),
        Patch(facecolor=_COMM["gather"], hatch="///", edgecolor="black", label="prefetched"),
        Patch(color=_COMPUTE["forward"], label="forward compute"),
        Patch(color=_COMPUTE["backward"], label="backward compute"),
        Patch(color=_COMM["reduce_scatter"], alpha=0.6, label="reduce-scatter (until waited)"),
        plt.Line2D([], [], color="black", linewidth=1.4, label="full parameter freed"),
    ]
    if any(u.replica_reduces for t in timelines.values() for u in t.units):
        handles.insert(5, Patch(color=_COMM["replicas"], label="all-reduce (replicas)"))
    fig.legend(handles=handles, loc="lower center", ncols=4, fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.5 / fig.get_figheight(), 1, 1))
    return fig


def plot_peak_memory(
    unit_bytes: Sequence[float],
    theory: Sequence[float],
    measured: Sequence[float] | None = None,
    labels: Sequence[str] | None = None,
    shard_bytes: float | None = None,
    all_bytes: float | None = None,
    title: str = "",
) -> Figure:
    """Peak parameter bytes per rank against the largest unit's bytes (KiB on both axes):
    the formula as open circles (one per configuration), measured points as crosses, the
    shards alone and every parameter as horizontal bounds."""
    fig, ax = plt.subplots(figsize=(7, 4))
    x = [b / 1024 for b in unit_bytes]
    # four separate configurations: markers, no line between them
    ax.plot(
        x,
        [b / 1024 for b in theory],
        "o",
        color="#4c72b0",
        markersize=9,
        markerfacecolor="none",
        markeredgewidth=1.5,
        label="formula",
    )
    if measured is not None:
        ax.plot(
            x,
            [b / 1024 for b in measured],
            "x",
            color="#c44e52",
            markersize=11,
            markeredgewidth=2,
            label="measured (rank 0)",
        )
    for xi, yi, label in zip(x, theory, labels or []):
        ax.annotate(label, (xi, yi / 1024), textcoords="offset points", xytext=(6, -12), fontsize=7)
    if all_bytes is not None:
        ax.axhline(all_bytes / 1024, color="gray", linestyle="--", linewidth=0.8)
        ax.text(
            x[0], all_bytes / 1024, "every parameter (data parallelism)", fontsize=7, va="bottom"
        )
    if shard_bytes is not None:
        ax.axhline(shard_bytes / 1024, color="gray", linestyle=":", linewidth=0.8)
        ax.text(x[0], shard_bytes / 1024, "shards only, Σψ/N", fontsize=7, va="bottom")
    ax.set_xlabel("largest unit's parameters (KiB)")
    ax.set_ylabel("peak parameter memory per rank (KiB)")
    ax.set_ylim(bottom=0)
    ax.set_title(title or "peak parameter memory vs unit size")
    ax.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    return fig
