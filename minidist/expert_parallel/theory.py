"""What expert parallelism should communicate, as functions of the measured routing.

Lepikhin et al. 2020 (GShard), section 2.2-3.2; Fedus et al. 2022 (Switch Transformer),
section 2.2. `send[i][j]` is how many kept (token, expert) assignments rank i routes to
experts held by rank j of the expert-parallel group. One rank sends, per MoE layer and step:

    forward   dispatch  Σ_{j≠i} send[i][j] · h · 4    its tokens going to other ranks' experts
              combine   Σ_{j≠i} send[j][i] · h · 4    the other ranks' tokens going home
    backward  the same two, reversed (the gradient of each row follows it back)
    counts    (e-1) · E/e · 8                          the int64 counts' all-to-all

(float32 rows; a token kept by two experts on another rank is sent twice). Padded to
capacity (GShard's static shapes), send[i][j] = E/e · C for every pair and there are no
counts: `padded_all_to_all_bytes`, known before any routing. Then the
gradients: the router's all-reduced over every rank, the experts' over the d ranks that hold
the same experts (ring model, `comm.ring_bytes`).
"""

from __future__ import annotations

from .. import comm
from .routing import capacity, load_balancing_loss

__all__ = [
    "capacity",
    "load_balancing_loss",
    "all_to_all_bytes",
    "bytes_sent_per_step",
    "balanced_all_to_all_bytes",
    "counts_bytes",
    "padded_all_to_all_bytes",
    "expert_flops",
    "padded_bytes_sent_per_step",
    "model_state_bytes_per_rank",
]


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


def padded_all_to_all_bytes(
    num_experts: int, e: int, cap: int, hidden: int, element_size: int = 4
) -> dict[str, float]:
    """{ledger tag: bytes} one rank sends per MoE layer with `pad_to_capacity=True`: E/e · C
    rows to each of the e-1 other ranks, in each of the four all-to-alls."""
    per = num_experts // e * cap
    return all_to_all_bytes([[per] * e for _ in range(e)], 0, hidden, element_size)


def expert_flops(num_experts: int, e: int, cap: int, hidden: int, ffn: int) -> float:
    """FLOPs of one rank's experts per MoE layer and step, padded to capacity: E/e experts,
    each on e·C rows (the padding computed too), 2·(h·f + f·h) per row forward, 3x with
    backward (Kaplan et al. 2020's 6 per parameter and token)."""
    return 3 * (num_experts // e) * (e * cap) * 4 * hidden * ffn


def counts_bytes(num_experts: int, e: int) -> float:
    """The counts' all-to-all: E/e int64 counts to each of the e-1 other ranks."""
    return float((e - 1) * (num_experts // e) * 8)


def bytes_sent_per_step(
    send,
    rank: int,
    hidden: int,
    num_experts: int,
    router_params: int,
    expert_params: int,
    world: int,
    d: int,
    counts: bool = True,
) -> float:
    """All a rank sends in one step: the all-to-alls for the measured `send`, the counts
    (none when padded to capacity: `counts=False`),
    the router's gradient all-reduce over `world` ranks, the local experts' (`expert_params`
    elements) over the d ranks holding them."""
    e = len(send)
    return (
        sum(all_to_all_bytes(send, rank, hidden).values())
        + (counts_bytes(num_experts, e) if counts else 0.0)
        + comm.ring_bytes("all_reduce", 4 * router_params, world)
        + comm.ring_bytes("all_reduce", 4 * expert_params, d)
    )


def balanced_all_to_all_bytes(
    tokens: int, hidden: int, k: int, e: int, element_size: int = 4
) -> float:
    """What a planner can use before any routing is measured: every rank's T·k assignments
    spread evenly over the e ranks and none dropped, so (e-1)/e of them leave: dispatch,
    combine and their two gradients, 4 · T·k·(e-1)/e · h · element_size bytes per layer."""
    return 4 * tokens * k * (e - 1) / e * hidden * element_size


def padded_bytes_sent_per_step(
    layers: int,
    num_experts: int,
    e: int,
    cap: int,
    hidden: int,
    replicated_params: int,
    expert_params: int,
    world: int,
    d: int,
    element_size: int = 4,
) -> float:
    """All a rank of `ExpertParallelGPT` (padded to capacity) sends per step: each MoE layer's
    four all-to-alls (`padded_all_to_all_bytes`), the replicated parameters' gradients (the
    routers' included) all-reduced over the `world`, the rank's experts' (`expert_params`
    elements, every layer) over the d ranks holding them: known before any routing."""
    per_layer = padded_all_to_all_bytes(num_experts, e, cap, hidden, element_size)
    return (
        layers * sum(per_layer.values())
        + comm.ring_bytes("all_reduce", element_size * replicated_params, world)
        + comm.ring_bytes("all_reduce", element_size * expert_params, d)
    )


def model_state_bytes_per_rank(
    replicated_params: int, expert_params: int, e: int, state_copies: int = 3
) -> int:
    """Bytes of model states one rank keeps: the replicated parameters and 1/e of the experts,
    float32, `state_copies` times (3: parameter, gradient and SGD's momentum)."""
    if expert_params % e:
        raise ValueError(
            f"model_state_bytes_per_rank: expert_params={expert_params} must divide by e={e}"
        )
    return 4 * state_copies * (replicated_params + expert_params // e)


def padded_saved_bytes(
    tokens: int,
    hidden: int,
    num_experts: int,
    k: int,
    e: int,
    cap: int,
    kept: int,
    element_size: int = 4,
) -> int:
    """Bytes one MoE layer saves for backward on a rank with `pad_to_capacity=True`, as
    autograd saves them for this course's code (torch 2.13, measured with saved-tensor
    hooks), T = `tokens` routed by the rank, K = `kept` of its T·k assignments:

        router      T·h (its input) + T·E (softmax) + T·k int64 (top-k indices)
                    + for k > 1 the renormalisation's T·k chosen and T sums, + E (the aux
                    loss's fractions)
        dispatch    K int64 token ids, K int64 slots, K·h gathered rows
        experts     E/e experts, each on e·C rows: its input, the GELU's input and output
                    (h + 4h + 4h per row)
        combine     K int64 choice ids, K gates, K·h rows back and K·h weighted rows

    K depends on the routing (K ≤ min(T·k, E·C)); the largest K bounds the layer."""
    floats = tokens * hidden + tokens * num_experts + num_experts
    if k > 1:
        floats += tokens * k + tokens
    floats += kept * hidden + kept + 2 * kept * hidden
    floats += num_experts // e * (e * cap) * 9 * hidden
    ints = tokens * k + 3 * kept
    return element_size * floats + 8 * ints
