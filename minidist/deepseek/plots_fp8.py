"""Pictures for lesson 19's FP8 training (arXiv:2412.19437 §3.3).

- `plot_error_table`: one GEMM's relative error against float64 by K, per format and
  scaling (`fp8_experiments.error_table`).
- `plot_fp8_loss_curves`: the loss in float32, bf16 and simulated FP8, and FP8's relative
  difference from bf16 (`fp8_experiments.loss_curves`).

Every function returns a matplotlib Figure and shows nothing itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from .fp8_experiments import relative_loss_difference


def plot_error_table(rows: Sequence[Mapping]) -> Figure:
    """Relative error (log axis) against K, one line per format in `rows`."""
    fig, ax = plt.subplots(figsize=(6, 4))
    ks = [row["K"] for row in rows]
    for name in (key for key in rows[0] if key != "K"):
        ax.plot(ks, [row[name] for row in rows], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("K (inner dimension)")
    ax.set_ylabel("relative error vs float64")
    ax.set_title("one GEMM, an outlier channel in the activations")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_fp8_loss_curves(curves: Mapping[str, Sequence[float]]) -> Figure:
    """Left: the loss per step of each mode; right: |fp8 − bf16| / bf16 per step, with the
    paper's 0.25% drawn."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for mode, losses in curves.items():
        left.plot(losses, label=mode)
    left.set_xlabel("step")
    left.set_ylabel("loss")
    left.legend()
    diff = relative_loss_difference(curves["fp8"], curves["bf16"])
    right.plot([100 * d for d in diff], label="fp8 vs bf16")
    right.axhline(0.25, color="grey", linestyle="--", label="paper: below 0.25%")
    right.set_xlabel("step")
    right.set_ylabel("relative loss difference (%)")
    right.legend()
    fig.tight_layout()
    return fig
