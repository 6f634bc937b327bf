"""What each all-reduce shape sends on each link class, and how long it takes: functions.

For S bytes padded to P = ceil(numel/(I·O))·I·O elements of b bytes, with I ranks in the
inner group and O in the outer group (N = I·O), each rank sends on a ring
(`minidist.comm.ring_bytes`, Patarasuk & Yuan 2009):

    inner links  reduce-scatter + all-gather   2·(I-1)/I · P·b
    outer links  all-reduce of one chunk       2·(O-1)/O · P·b / I
    flat ring    all-reduce over all N         2·(N-1)/N · P·b      (= the sum of the two)

So the two-level scheme moves the same bytes per rank as a flat ring, but puts the share
2(I-1)/I on the inner links and only 1/I of a ring's share on the outer ones: the inner
direction should be the faster one. Time, in Hockney's α-β model per link class (one ring
step costs α of its link; the bytes go at its bandwidth): the two-level all-reduce takes
2(I-1) inner steps and 2(O-1) outer steps; a flat ring over the mesh takes 2(N-1) steps on
its slowest link, with its bandwidth. `predict_times` compares flat, row-inner and
column-inner (or intra-inner) for a message size and says which is fastest. The model
ignores contention, bidirectional rings and the overlap of the two dimensions.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import comm
from .all_reduce import padded_numel


@dataclass(frozen=True)
class Link:
    """One link class: start-up latency per ring step (s) and bandwidth (bytes/s)."""

    alpha_s: float
    bandwidth_bytes_per_s: float


def two_level_bytes(
    numel: int, inner_size: int, outer_size: int, element_size: int = 4
) -> dict[str, float]:
    """{"inner": bytes one rank sends on inner links, "outer": on outer links} for one
    two-level all-reduce of `numel` elements; the ledger records exactly these."""
    padded = padded_numel(numel, inner_size, outer_size) * element_size
    rs_ag = comm.ring_bytes("reduce_scatter", padded, inner_size) + comm.ring_bytes(
        "all_gather", padded, inner_size
    )
    return {
        "inner": rs_ag,
        "outer": comm.ring_bytes("all_reduce", padded // inner_size, outer_size),
    }


def flat_bytes(numel: int, world_size: int, element_size: int = 4) -> float:
    """Bytes one rank sends in a flat ring all-reduce (unpadded, as the ledger records it)."""
    return comm.ring_bytes("all_reduce", numel * element_size, world_size)


def two_level_time(
    numel: int, inner_size: int, outer_size: int, inner: Link, outer: Link, element_size=4
) -> float:
    """α-β seconds of the two-level all-reduce: 2(I-1) inner steps, 2(O-1) outer steps."""
    b = two_level_bytes(numel, inner_size, outer_size, element_size)
    return (
        2 * (inner_size - 1) * inner.alpha_s
        + b["inner"] / inner.bandwidth_bytes_per_s
        + 2 * (outer_size - 1) * outer.alpha_s
        + b["outer"] / outer.bandwidth_bytes_per_s
    )


def flat_time(numel: int, world_size: int, links: list[Link], element_size: int = 4) -> float:
    """α-β seconds of a flat ring crossing every link class in `links`: each of its 2(N-1)
    steps waits for the slowest link (largest α, smallest bandwidth)."""
    alpha = max(link.alpha_s for link in links)
    bandwidth = min(link.bandwidth_bytes_per_s for link in links)
    return 2 * (world_size - 1) * alpha + flat_bytes(numel, world_size, element_size) / bandwidth


def predict_times(
    numel: int, rows: int, cols: int, row: Link, column: Link, element_size: int = 4
) -> dict[str, float]:
    """{"flat", "row-inner", "column-inner": seconds} on an R×C mesh (for nodes: rows =
    nodes, cols = ranks per node, row = the intra-node link, column = the inter-node one)."""
    return {
        "flat": flat_time(numel, rows * cols, [row, column], element_size),
        "row-inner": two_level_time(numel, cols, rows, row, column, element_size),
        "column-inner": two_level_time(numel, rows, cols, column, row, element_size),
    }


def fastest(times: dict[str, float]) -> str:
    """The name of the smallest time."""
    return min(times, key=times.get)
