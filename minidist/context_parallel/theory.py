"""What context parallelism should communicate, store and compute, as functions.

Liu et al. 2023, "Ring Attention with Blockwise Transformers for Near-Infinite Context",
section 3; the balanced causal split of Megatron-LM's context parallelism
(`get_batch_on_this_cp_rank`) and ring-flash-attention (two chunks per rank, r and 2c-1-r).

Per layer and step, a rank of c sends its K and V block c-1 times in forward: (c-1)/c of
the whole sequence's K and V. In backward the blocks go around again (c-1 sends) and each
block's gradient accumulator follows it home (c sends). Around the layers the ranks' weight
gradients are summed once per step (one all-reduce of the model) and the loss value once.
Every activation is per token, so a rank stores 1/c of them.
"""

from __future__ import annotations

from .. import comm


def kv_bytes(batch: int, seq: int, hidden: int, element_size: int = 4) -> int:
    """Bytes of one layer's K and V for the whole sequence (heads · head_dim = hidden)."""
    return 2 * batch * seq * hidden * element_size


def ring_bytes_per_layer(batch: int, seq: int, hidden: int, c: int, element_size: int = 4):
    """{phase: bytes one rank sends}: forward (c-1)/c·KV; backward (c-1)/c·KV for the
    blocks plus c/c·KV for their gradients."""
    whole = kv_bytes(batch, seq, hidden, element_size)
    return {
        "forward": (c - 1) * whole / c,
        "backward K, V": (c - 1) * whole / c,
        "backward dK, dV": whole if c > 1 else 0.0,
    }


def bytes_sent_per_step(
    layers: int, batch: int, seq: int, hidden: int, c: int, trainable: int
) -> float:
    """Bytes one rank sends per step (float32): the ring's, per layer, plus the all-reduce
    of the `trainable` gradient elements and of the loss value (ring model)."""
    ring = layers * sum(ring_bytes_per_layer(batch, seq, hidden, c).values())
    return (
        ring + comm.ring_bytes("all_reduce", 4 * trainable, c) + comm.ring_bytes("all_reduce", 4, c)
    )


def causal_pairs(layout: str, c: int) -> list[int]:
    """Chunk pairs (query chunk, key chunk) each rank computes with the causal mask: a pair
    is skipped when every key follows every query. Contiguous (c chunks): rank r computes
    r + 1. Zig-zag (2c chunks, rank r holds r and 2c-1-r): r + 1 + 2c - r = 2c + 1 each."""
    if layout == "contiguous":
        return [r + 1 for r in range(c)]
    if layout == "zigzag":
        return [2 * c + 1] * c
    raise ValueError(f"causal_pairs: layout must be 'contiguous' or 'zigzag', got {layout!r}")


def causal_work(layout: str, seq: int, c: int) -> list[int]:
    """Score elements each rank computes per head and sequence: pairs × chunk²."""
    chunk = seq // (c if layout == "contiguous" else 2 * c)
    return [p * chunk * chunk for p in causal_pairs(layout, c)]


def imbalance(layout: str, c: int) -> float:
    """The busiest rank's work over the mean: 2c/(c+1) contiguous, 1 zig-zag."""
    pairs = causal_pairs(layout, c)
    return max(pairs) / (sum(pairs) / c)
