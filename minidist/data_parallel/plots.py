"""Pictures for data parallelism (notebook 01): the step timeline per rank and the buckets.

- `plot_timeline`: for each rank, a compute lane (forward, backward, wait + step) above a
  communication lane (one bar per all-reduce, labelled by its tag), with the overlap
  fraction in the rank's label. Li et al. 2020, "PyTorch Distributed", section 3.2: bucketed
  all-reduces launched from autograd hooks run while backward is still computing.
- `plot_buckets`: which parameters went into which bucket (reverse registration order,
  section 3.2.3), each bar as wide as its bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from ..data_parallel.timeline import StepTimeline

_COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "step": "#55a868", "comm": "#c44e52"}
# After backward a rank first waits for its outstanding all-reduces, then steps.
_LABELS = {"forward": "forward", "backward": "backward", "step": "wait for comm + step"}


def plot_timeline(timelines: Sequence[StepTimeline], title: str = "") -> Figure:
    """One compute lane and one communication lane per rank; times in milliseconds."""
    fig, ax = plt.subplots(figsize=(10, 1.2 + 1.1 * len(timelines)))
    ticks, labels = [], []
    for rank, t in enumerate(timelines):
        compute_y, comm_y = -2 * rank, -2 * rank - 0.9
        phases = [
            ("forward", 0.0, t.forward_end),
            ("backward", t.forward_end, t.backward_end),
            ("step", t.backward_end, t.step_end),
        ]
        for name, start, end in phases:
            ax.barh(
                compute_y,
                1e3 * (end - start),
                left=1e3 * start,
                height=0.7,
                color=_COLORS[name],
                label=_LABELS[name] if rank == 0 else None,
            )
        for i, (start, end, tag, _) in enumerate(t.comm):
            # alternate shades so back-to-back all-reduces stay distinguishable
            ax.barh(
                comm_y,
                1e3 * (end - start),
                left=1e3 * start,
                height=0.7,
                color=_COLORS["comm"],
                alpha=1.0 if i % 2 == 0 else 0.6,
                edgecolor="black",
                linewidth=0.4,
                label="all-reduce" if rank == 0 and i == 0 else None,
            )
            if len(t.comm) <= 12:
                ax.text(1e3 * start, comm_y + 0.42, tag, fontsize=6, va="bottom")
        ticks += [compute_y, comm_y]
        labels += [f"rank {rank} compute", f"comm (overlap {100 * t.overlap:.0f}%)"]
    ax.set_yticks(ticks, labels)
    ax.set_xlabel("time since the start of forward (ms)")
    ax.set_title(title or "one training step per rank")
    ax.legend(loc="upper right", fontsize=8, ncols=4)
    ax.margins(y=0.15)
    fig.tight_layout()
    return fig


def plot_buckets(
    param_names: Sequence[str],
    param_bytes: Sequence[int],
    buckets: Sequence[Sequence[int]],
    title: str = "",
) -> Figure:
    """One row per bucket (bucket 0 on top), a segment per parameter, as wide as its bytes."""
    fig, ax = plt.subplots(figsize=(10, 0.8 + 0.6 * len(buckets)))
    cmap = plt.get_cmap("tab20")
    widest = max(sum(param_bytes[i] for i in indices) for indices in buckets) / 1024
    for b, indices in enumerate(buckets):
        left = 0
        for i in indices:
            width = param_bytes[i] / 1024
            ax.barh(
                -b,
                width,
                left=left,
                height=0.7,
                color=cmap(i % 20),
                edgecolor="black",
                linewidth=0.4,
            )
            if width > 0.04 * widest:  # tiny biases would only add clutter
                ax.text(
                    left + width / 2,
                    -b,
                    param_names[i],
                    ha="center",
                    va="center",
                    fontsize=6,
                    rotation=0 if width > 0.2 * widest else 90,
                )
            left += width
    ax.set_yticks([-b for b in range(len(buckets))], [f"bucket {b}" for b in range(len(buckets))])
    ax.set_xlabel("KiB")
    ax.set_title(title or "gradient buckets (filled in reverse registration order)")
    fig.tight_layout()
    return fig
