"""Worked examples with published link figures: a TPU v3 slice and DGX A100 / H100 clusters.

Bandwidths are the vendors' published figures, per direction (a ring sends one way):

- **TPU v3** (Jouppi et al. 2020, "A Domain-Specific Supercomputer for Training Deep Neural
  Networks", CACM 63(7), Table 3: 4 inter-chip (ICI) links per chip at 656 Gbit/s, i.e.
  82 GB/s; Google Cloud, "TPU v3" system architecture page: a pod is 1024 chips in a 2D
  torus, all-reduce bandwidth 340 TB/s per pod, which is 1024 chips × 4 links × ~83 GB/s,
  consistent). Both torus dimensions use the same links. The example is a 16×32 slice,
  512 chips (1024 TensorCores: Cloud's "v3-1024"), half a pod.
- **DGX A100** (NVIDIA DGX A100 datasheet / system architecture white paper: third-generation
  NVLink through NVSwitch, 600 GB/s per GPU in both directions together, 300 GB/s each way;
  8 ConnectX-6 HDR InfiniBand adapters per node for the compute fabric, one per GPU, 200
  Gbit/s = 25 GB/s each way).
- **DGX H100** (NVIDIA DGX H100 datasheet: fourth-generation NVLink, 900 GB/s per GPU in both
  directions, 450 GB/s each way; 8 ConnectX-7 NDR adapters at 400 Gbit/s = 50 GB/s each way).

The start-up latencies α are not published per link in these sources; `ALPHA_S` holds
assumed values of the usual order (about a microsecond on a chip-to-chip or NVLink hop,
a few on InfiniBand through a switch), and the tests check that the predicted choices hold
for every α from 0.5 to 10 µs. Which shape is fastest is then `theory.predict_times` and
`theory.fastest`; where to put tensor parallelism is `tensor_parallel_direction`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import comm
from .theory import Link, predict_times

GBIT = 1e9 / 8  # bytes per second in one Gbit/s

ALPHA_S = {"ici": 1e-6, "nvlink": 1e-6, "infiniband": 5e-6}  # assumed, not published


@dataclass(frozen=True)
class System:
    """An R×C grid of chips with one link class per direction (rows: C chips sharing row
    links; for a GPU cluster a row is a node: rows = nodes, cols = GPUs per node)."""

    name: str
    rows: int
    cols: int
    row: Link  # the link class between chips of a row (a node's NVLink)
    column: Link  # between chips of a column (InfiniBand for a cluster)
    source: str


def tpu_v3_slice(rows: int = 16, cols: int = 32, alpha_s: float = ALPHA_S["ici"]) -> System:
    """A TPU v3 slice: the same ICI link (656 Gbit/s) in both torus dimensions."""
    ici = Link(alpha_s, 656 * GBIT)
    return System(
        f"TPU v3 {rows}x{cols}",
        rows,
        cols,
        ici,
        ici,
        "Jouppi et al. 2020 (CACM), Table 3; cloud.google.com/tpu/docs/v3",
    )


def dgx_cluster(
    generation: str = "A100",
    nodes: int = 4,
    nvlink_alpha_s=ALPHA_S["nvlink"],
    ib_alpha_s=ALPHA_S["infiniband"],
) -> System:
    """`nodes` DGX nodes of 8 GPUs: NVLink inside a node, one InfiniBand adapter per GPU."""
    figures = {"A100": (300e9, 200 * GBIT), "H100": (450e9, 400 * GBIT)}
    if generation not in figures:
        raise ValueError(
            f"dgx_cluster: generation must be one of {list(figures)}, got {generation!r}"
        )
    nvlink, ib = figures[generation]
    return System(
        f"{nodes} x DGX {generation}",
        nodes,
        8,
        Link(nvlink_alpha_s, nvlink),
        Link(ib_alpha_s, ib),
        f"NVIDIA DGX {generation} datasheet",
    )


def shape_times(system: System, message_bytes: float, element_size: int = 2) -> dict[str, float]:
    """α-β seconds of flat ring, row-inner and column-inner all-reduce of `message_bytes`
    (bf16 elements by default) on `system`."""
    numel = max(1, int(message_bytes // element_size))
    return predict_times(numel, system.rows, system.cols, system.row, system.column, element_size)


def tensor_parallel_time(link: Link, group: int, message_bytes: float) -> float:
    """α-β seconds of one tensor-parallel all-reduce over `group` ranks on one link class."""
    return (
        2 * (group - 1) * link.alpha_s
        + comm.ring_bytes("all_reduce", message_bytes, group) / link.bandwidth_bytes_per_s
    )


def tensor_parallel_direction(system: System, group: int, message_bytes: float) -> str:
    """ "row" or "column": where a tensor-parallel group of `group` ranks should lie (its
    all-reduces run every layer: the heavier traffic); "either" when both take as long."""
    row = tensor_parallel_time(system.row, group, message_bytes)
    column = tensor_parallel_time(system.column, group, message_bytes)
    if abs(row - column) <= 1e-12 * max(row, column):
        return "either"
    return "row" if row < column else "column"


def latency_bandwidth_crossover(system: System) -> float:
    """Message bytes at which a flat ring's bandwidth term equals its latency term,
    2(N-1)·α = 2(N-1)/N·S/B on its slowest link: S* = N·α·B. Far below S* the step count
    decides (a two-level all-reduce takes 2(R-1) + 2(C-1) steps instead of 2(N-1)); far above
    it the bytes on the slowest link do."""
    n = system.rows * system.cols
    alpha = max(system.row.alpha_s, system.column.alpha_s)
    bandwidth = min(system.row.bandwidth_bytes_per_s, system.column.bandwidth_bytes_per_s)
    return n * alpha * bandwidth
