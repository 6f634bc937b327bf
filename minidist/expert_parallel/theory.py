"""What expert parallelism should communicate, as functions of the measured routing.

Lepikhin et al. 2020 (GShard), section 2.2-3.2; Fedus et al. 2021 (Switch Transformer),
section 2.2. `send[i][j]` is how many kept (token, expert) assignments rank i routes to
experts held by rank j of the expert-parallel group. One rank sends, per MoE layer and step:

    forward   dispatch  Σ_{j≠i} send[i][j] · h · 4    its tokens going to other ranks' experts
              combine   Σ_{j≠i} send[j][i] · h · 4    the other ranks' tokens going home
    backward  the same two, reversed (the gradient of each row follows it back)
    counts    (e-1) · E/e · 8                          the int64 counts' all-to-all

(float32 rows; a token kept by two experts on another rank is sent twice). Then the
gradients: the router's all-reduced over every rank, the experts' over the d ranks that hold
the same experts (ring model, `comm.ring_bytes`).
"""

from __future__ import annotations

from .. import comm
from .routing import capacity, load_balancing_loss

__all__ = [
    "capacity", "load_balancing_loss", "all_to_all_bytes", "bytes_sent_per_step",
    "balanced_all_to_all_bytes", "counts_bytes",
]  # fmt: skip


def all_to_all_bytes(send, rank: int, hidden: int, element_size: int = 4) -> dict[str, float]:
    """{ledger tag: bytes `rank` sends} for one forward and backward of one MoE layer."""
    e = len(send)
    out_rows = sum(send[rank][j] for j in range(e) if j != rank)
    in_rows = sum(send[j][rank] for j in range(e) if j != rank)
    row = hidden * element_size
    return {
        "ep dispatch": float(out_rows * row),
        "ep combine": float(in_rows * row),
        "ep combine grad": float(out_rows * row),
        "ep dispatch grad": float(in_rows * row),
    }


def counts_bytes(num_experts: int, e: int) -> float:
    """The counts' all-to-all: E/e int64 counts to each of the e-1 other ranks."""
    return float((e - 1) * (num_experts // e) * 8)


def bytes_sent_per_step(
    send, rank: int, hidden: int, num_experts: int, router_params: int,
    expert_params: int, world: int, d: int,
) -> float:  # fmt: skip
    """All a rank sends in one step: the all-to-alls for the measured `send`, the counts,
    the router's gradient all-reduce over `world` ranks, the local experts' (`expert_params`
    elements) over the d ranks holding them."""
    e = len(send)
    return (
        sum(all_to_all_bytes(send, rank, hidden).values())
        + counts_bytes(num_experts, e)
        + comm.ring_bytes("all_reduce", 4 * router_params, world)
        + comm.ring_bytes("all_reduce", 4 * expert_params, d)
    )


def balanced_all_to_all_bytes(tokens: int, hidden: int, k: int, e: int,
                              element_size: int = 4) -> float:  # fmt: skip
    """What a planner can use before any routing is measured: every rank's T·k assignments
    spread evenly over the e ranks and none dropped, so (e-1)/e of them leave: dispatch,
    combine and their two gradients, 4 · T·k·(e-1)/e · h · element_size bytes per layer."""
    return 4 * tokens * k * (e - 1) / e * hidden * element_size
