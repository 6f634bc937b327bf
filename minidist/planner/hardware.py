"""Devices and networks as the planner sees them: a FLOP rate, a memory bandwidth and size,
and an α-β link (lesson 00's `CostModel`) per network level.

Published figures (peak, dense, 16-bit, from the vendors' datasheets):

| device | FLOP/s | HBM bytes/s | memory | fast links (one direction) | slow links |
|---|---|---|---|---|---|
| V100 SXM2 32 GB | 125e12 | 0.9e12 | 32 GB | NVLink 2: 150e9 | 100 Gb/s IB per GPU (DGX-2) |
| A100 SXM 80 GB | 312e12 | 2.039e12 | 80 GB | NVLink 3: 300e9 | 200 Gb/s IB per GPU (DGX A100) |
| H100 SXM 80 GB | 989e12 | 3.35e12 | 80 GB | NVLink 4: 450e9 | 400 Gb/s IB per GPU (DGX H100) |
| TPU v5p | 459e12 | 2.765e12 | 95 GB | ICI: 4.5e10 per link and direction, a 3D torus | DCN |

Latencies (α) are not on datasheets: 5 µs inside a node and 20 µs across nodes are the
orders of magnitude NCCL's small-message all-reduces show; they matter only for small
messages. `measure.fit_here` measures all three numbers on this machine instead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..collectives.cost_model import CostModel, fit_alpha_beta, time_all_reduce
from ..comm import ring_bytes


@dataclass(frozen=True)
class Device:
    name: str
    flops: float  # per second, the precision the plan computes in
    memory_bandwidth: float  # bytes per second
    memory_bytes: float


@dataclass(frozen=True)
class Cluster:
    """`devices_per_node` devices on `intra` links; nodes joined by `inter` links."""

    device: Device
    intra: CostModel
    inter: CostModel
    devices_per_node: int

    def link(self, stride: int, size: int) -> CostModel:
        """The links a group of `size` ranks `stride` apart runs on: inside one node when it
        spans no more than a node (Megatron's order: tp innermost, then dp, pp outermost)."""
        return self.intra if stride * (size - 1) < self.devices_per_node else self.inter


V100 = Device("V100 SXM2 32 GB", 125e12, 0.9e12, 32e9)
A100 = Device("A100 SXM 80 GB", 312e12, 2.039e12, 80e9)
H100 = Device("H100 SXM 80 GB", 989e12, 3.35e12, 80e9)
TPU_V5P = Device("TPU v5p", 459e12, 2.765e12, 95e9)

INTRA_ALPHA, INTER_ALPHA = 5e-6, 20e-6

DGX2_V100 = Cluster(V100, CostModel(INTRA_ALPHA, 150e9), CostModel(INTER_ALPHA, 12.5e9), 16)
DGX_A100 = Cluster(A100, CostModel(INTRA_ALPHA, 300e9), CostModel(INTER_ALPHA, 25e9), 8)
DGX_H100 = Cluster(H100, CostModel(INTRA_ALPHA, 450e9), CostModel(INTER_ALPHA, 50e9), 8)
# One axis of a TPU v5p torus: two neighbours, both directions: 4 × 4.5e10 bytes/s, the
# "W_ici" of "How to Scale Your Model" (part 5: data parallelism turns communication-bound
# below C / W_ici ≈ 2550 tokens per chip). The torus is one level: intra = inter.
TPU_V5P_AXIS = CostModel(1e-6, 4 * 4.5e10)
TPU_V5P_POD = Cluster(TPU_V5P, TPU_V5P_AXIS, TPU_V5P_AXIS, 8960)

CLUSTERS = {
    "dgx2-v100": DGX2_V100,
    "dgx-a100": DGX_A100,
    "dgx-h100": DGX_H100,
    "tpu-v5p": TPU_V5P_POD,
}


def measure_memory_bandwidth(numel: int = 1 << 22, repeats: int = 10) -> float:
    """Bytes/s of a float32 copy (read + write) of `numel` elements (best of `repeats`)."""
    src, dst = torch.randn(numel, device="cpu"), torch.empty(numel, device="cpu")
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * 4 * numel / best


def fit_links_on_rank(sizes=(1 << 10, 1 << 14, 1 << 18, 1 << 20)) -> CostModel:
    """Run on every rank of a world: α and bandwidth of its all-reduce (lesson 00's fit)."""
    import torch.distributed as dist

    n = dist.get_world_size()
    seconds = time_all_reduce(list(sizes))
    return fit_alpha_beta([ring_bytes("all_reduce", s, n) for s in sizes], seconds)
