"""Lesson 15's figures: which (query, key) chunk pairs each rank computes under the causal
mask, contiguous against zig-zag, the ring's steps, and a ring step's transfer under its
computation (the timeline)."""

from __future__ import annotations

from . import theory
from .split import chunks_of, rank_chunks


def plot_causal_work(c: int = 4):
    """Left, middle: the causal mask over 2c chunks, each computed chunk pair coloured by the
    rank that computes it (contiguous, zig-zag); right: chunk pairs per rank."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), gridspec_kw=dict(width_ratios=[1, 1.35, 1.2]))
    n = 2 * c
    colors = plt.cm.tab10.colors
    for ax, layout in zip(axes[:2], ("contiguous", "zigzag")):
        per = n // chunks_of(layout, c)  # fine chunks per chunk of the layout
        for r in range(c):
            for qc in rank_chunks(layout, c, r):
                for kc in range(chunks_of(layout, c)):
                    if kc > qc:
                        continue
                    for i in range(per):
                        for j in range(per):
                            y, x = qc * per + i, kc * per + j
                            masked = x > y
                            ax.add_patch(
                                Rectangle(
                                    (x, n - 1 - y),
                                    1,
                                    1,
                                    facecolor="white" if masked else colors[r],
                                    edgecolor="gray",
                                    hatch="//" if masked else None,
                                    linewidth=0.5,
                                )
                            )
        ax.set_xlim(0, n)
        ax.set_ylim(0, n)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlabel("keys (position →)")
        ax.set_ylabel("queries (position ↓)")
        ax.set_title(
            f"{layout}: computed blocks by rank\n(hatched: computed, then masked)", fontsize=9
        )
    handles = [Rectangle((0, 0), 1, 1, facecolor=colors[r]) for r in range(c)]
    axes[1].legend(
        handles,
        [f"rank {r}" for r in range(c)],
        title="computed by",
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
    )
    ax = axes[2]
    width = 0.38
    # the layouts in grays and hatches: the colours of the other two panels are ranks
    styles = {"contiguous": dict(color="0.75", hatch=""), "zigzag": dict(color="0.35", hatch="..")}
    for i, layout in enumerate(("contiguous", "zigzag")):
        work = theory.causal_work(layout, 2 * c * 8, c)
        ax.bar(
            [r + (i - 0.5) * width for r in range(c)],
            work,
            width,
            edgecolor="black",
            label=f"{layout} (max/mean {theory.imbalance(layout, c):.2f})",
            **styles[layout],
        )
    ax.set_xticks(range(c), [f"rank {r}" for r in range(c)])
    ax.set_ylabel("score elements per head and sequence")
    ax.set_title(f"causal work per rank, c = {c}, s = {16 * c}", fontsize=9)
    ax.legend(fontsize=8, title="layout (bars, not ranks)")
    fig.tight_layout()
    return fig


def plot_ring_steps(c: int = 4):
    """Which rank's K/V block each rank holds at each step of the ring (c steps)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.2 * c + 2, 0.6 * c + 1.2))
    colors = plt.cm.tab10.colors
    for step in range(c):
        for r in range(c):
            owner = (r - step) % c
            ax.add_patch(
                plt.Rectangle((step, c - 1 - r), 0.95, 0.9, color=colors[owner], alpha=0.8)
            )
            ax.text(
                step + 0.47,
                c - 1 - r + 0.45,
                f"K,V of {owner}",
                ha="center",
                va="center",
                fontsize=8,
            )
    ax.set_xlim(0, c)
    ax.set_ylim(0, c)
    ax.set_xticks([s + 0.47 for s in range(c)], [f"step {s}" for s in range(c)])
    ax.set_yticks([c - 1 - r + 0.45 for r in range(c)], [f"rank {r}" for r in range(c)])
    ax.set_title("the ring: each step a rank passes its block to rank r+1", fontsize=9)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


_LANE_COLORS = {
    "compute": "tab:blue",
    "cp-kv-forward": "tab:orange",
    "cp-kv-backward": "tab:orange",
    "cp-dkv-backward": "tab:red",
}
_LANE_LABELS = {
    "compute": "attention on the block held",
    "cp-kv-forward": "K,V to the next rank",
    "cp-dkv-backward": "dK,dV accumulator to the next rank",
}


def plot_ring_timeline(timelines, title: str = ""):
    """Per rank a compute lane above a transfer lane (post to end of wait), in milliseconds:
    `timeline.RingTimeline`s of one forward and backward, one per rank."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 1.2 + 1.1 * len(timelines)))
    ticks, labels, seen = [], [], set()
    for rank, t in enumerate(timelines):
        compute_y, comm_y = -2 * rank, -2 * rank - 0.9
        for what, start, end in t.events:
            y = compute_y if what == "compute" else comm_y
            label = _LANE_LABELS.get(what) if what not in seen else None
            seen.add(what)
            ax.barh(
                y,
                1e3 * (end - start),
                left=1e3 * start,
                height=0.7,
                color=_LANE_COLORS[what],
                edgecolor="black",
                linewidth=0.4,
                label=label,
            )
        ax.vlines(
            1e3 * t.forward_end,
            comm_y - 0.45,
            compute_y + 0.45,
            color="black",
            linestyle=":",
            linewidth=1.0,
        )
        ticks += [compute_y, comm_y]
        labels += [f"rank {rank} compute", f"transfers (K,V overlap {100 * t.overlap:.0f}%)"]
    ax.set_yticks(ticks, labels)
    ax.set_xlabel("time since the rank's start of forward (ms); dotted: its end of forward")
    ax.set_title(title or "ring attention: each step's transfer runs under its computation")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), fontsize=8, ncols=3)
    ax.margins(y=0.15)
    fig.tight_layout()
    return fig
