"""The α-β cost model of a collective: time = α + bytes / bandwidth.

Hockney 1994, "The communication challenge for MPP: Intel Paragon and Meiko CS-2": a
message of n bytes takes α (start-up latency) plus n·β (β = 1 / bandwidth). For a ring
all-reduce the bytes that count are the ones each rank sends, 2(N-1)/N·S for a tensor of S
bytes (Patarasuk & Yuan 2009), which is the factor NCCL-tests uses to turn measured time
into "bus bandwidth" (NCCL-tests doc/PERFORMANCE.md): busbw = 2(N-1)/N·S / time. A fitted
bandwidth is therefore comparable across world sizes and with the link's own speed.

`time_all_reduce` measures on a rank inside `minidist.launch`; `fit_alpha_beta` fits the two
numbers by least squares; `CostModel.predict` gives back a time. This module does not model
tree algorithms, contention between concurrent collectives or compute/communication overlap.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from .. import comm


@dataclass(frozen=True)
class CostModel:
    """time = alpha_s + ring_bytes / bandwidth_bytes_per_s (Hockney's α and 1/β)."""

    alpha_s: float
    bandwidth_bytes_per_s: float

    def predict(self, ring_bytes: float | np.ndarray) -> float | np.ndarray:
        """Seconds for a collective in which each rank sends `ring_bytes`."""
        return self.alpha_s + np.asarray(ring_bytes, dtype=float) / self.bandwidth_bytes_per_s


def time_all_reduce(sizes_bytes: list[int], repeats: int = 5, group=None) -> list[float]:
    """Median seconds of an all-reduce of a float32 tensor of each size (call on a rank).

    Each size gets one untimed warm-up (first use of a buffer size allocates), then `repeats`
    timed calls, each starting after a barrier so that every rank enters together and the
    time is the collective's, not the wait for a late rank. All through `minidist.comm`, so a
    ledger open around the sweep sees every call.
    """
    out = []
    for size in sizes_bytes:
        tensor = torch.ones(max(1, size // 4), dtype=torch.float32, device=comm.group_device(group))
        comm.all_reduce(tensor, group=group)
        times = []
        for _ in range(repeats):
            comm.barrier(group=group)
            start = time.perf_counter()
            comm.all_reduce(tensor, group=group)
            times.append(time.perf_counter() - start)
        out.append(statistics.median(times))
    return out


def fit_alpha_beta(ring_bytes: list[float], seconds: list[float]) -> CostModel:
    """Least-squares fit of seconds = α + ring_bytes / bandwidth.

    `ring_bytes` is what each rank sends, 2(N-1)/N·S for an all-reduce of S bytes
    (`comm.ring_bytes("all_reduce", S, N)`), so the bandwidth is NCCL-tests' bus bandwidth.
    Residuals are relative (each row divided by its time): sweeps span decades of sizes, and
    plain residuals would let the largest message decide α alone.
    """
    x = np.asarray(ring_bytes, dtype=float)
    y = np.asarray(seconds, dtype=float)
    if x.size < 2 or np.ptp(x) == 0:
        raise ValueError("fit_alpha_beta needs at least two different sizes")
    design = np.stack([np.ones_like(x), x], axis=1) / y[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(y), rcond=None)
    # β ≤ 0 means the sweep never left the latency-bound regime: bandwidth is unmeasured.
    return CostModel(float(alpha), float(1.0 / beta) if beta > 0 else float("inf"))
