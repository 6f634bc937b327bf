"""The α-β cost model against measurement (notebook 00): all-reduce time vs message size.

Log-log axes show both regimes of Hockney's model: a flat line where the start-up latency α
dominates (small messages) and a slope of 1 where bandwidth does (large messages). The
fitted line uses the ring bytes per rank, 2(N-1)/N·S (NCCL-tests doc/PERFORMANCE.md).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from .. import comm
from ..cost_model import CostModel


def plot_cost_model(
    measured: dict[int, tuple[list[int], list[float]]], models: dict[int, CostModel]
) -> Figure:
    """Measured all-reduce seconds (points) and the fitted α-β model (lines), per world size.

    `measured[N]` is (tensor sizes in bytes, seconds); `models[N]` the fit for that N.
    """
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, (n, (sizes, seconds)) in enumerate(sorted(measured.items())):
        color = f"C{i}"
        ax.plot(sizes, np.asarray(seconds) * 1e3, "o", color=color, label=f"measured, N={n}")
        if n in models:
            m = models[n]
            grid = np.geomspace(min(sizes), max(sizes), 100)
            ax.plot(
                grid, m.predict(comm.ring_bytes("all_reduce", 1, n) * grid) * 1e3, "-",
                color=color,
                label=f"α-β fit, N={n}: α={m.alpha_s * 1e6:.0f} µs, "
                f"bw={m.bandwidth_bytes_per_s / 1e9:.2f} GB/s",
            )  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tensor size S (bytes)")
    ax.set_ylabel("all-reduce time (ms)")
    ax.set_title("time = α + 2(N-1)/N·S / bandwidth")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig
