"""The bytes HugeCTR's placements send, and what a rank holds, as functions (lesson 11).

Counted as `minidist.comm` records them: an all-to-all sends what leaves this rank (its own
chunk stays), a reduce-scatter or all-gather of a full tensor of S bytes sends (N-1)/N·S
(`comm.ring_bytes`). Keys and bag ids are int64 (8 bytes), vectors float32 (4 bytes per
element). `distributed_slot_*` are `DistributedSlotSparseEmbeddingHash`'s all-to-all
scheme, `distributed_slot_reduce_scatter_*` its default (HugeCTR's) scheme.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..comm import ring_bytes


def _others(counts: Sequence[int], rank: int) -> int:
    return sum(c for r, c in enumerate(counts) if r != rank)


def distributed_slot_forward_bytes(
    keys_to: Sequence[int], keys_from: Sequence[int], rank: int, dim: int
) -> int:
    """Distributed slots: counts (N-1)·8, keys to owners 8·Σ keys_to[r≠rank], vectors back
    4·D·Σ keys_from[r≠rank] (keys_to[r]: occurrences this rank sends to r; keys_from[r]:
    occurrences r sends here)."""
    world = len(keys_to)
    return 8 * (world - 1) + 8 * _others(keys_to, rank) + 4 * dim * _others(keys_from, rank)


def localized_slot_forward_bytes(
    bags_to: Sequence[int], keys_to: Sequence[int], bags_from: Sequence[int], rank: int, dim: int
) -> int:
    """Localized slots: counts (N-1)·16 (bags and keys), bag lengths 8·Σ bags_to[r≠rank],
    keys 8·Σ keys_to[r≠rank], pooled vectors back 4·D·Σ bags_from[r≠rank]."""
    world = len(bags_to)
    return (
        16 * (world - 1)
        + 8 * _others(bags_to, rank)
        + 8 * _others(keys_to, rank)
        + 4 * dim * _others(bags_from, rank)
    )


def localized_slot_step_bytes(
    bags_to: Sequence[int], keys_to: Sequence[int], bags_from: Sequence[int], rank: int, dim: int
) -> int:
    """Localized slots, one training step: the forward's bytes plus the backward's reverse
    all-to-all of the pooled gradients, back to the slots' owners: 4·D·Σ bags_to[r≠rank]."""
    forward = localized_slot_forward_bytes(bags_to, keys_to, bags_from, rank, dim)
    return forward + 4 * dim * _others(bags_to, rank)


def distributed_slot_step_bytes(
    keys_to: Sequence[int], keys_from: Sequence[int], rank: int, dim: int
) -> int:
    """Distributed slots, one training step: the forward's bytes plus the backward's
    all-to-all, which returns the gradient of every vector this rank received to its owner,
    4·D·Σ keys_to[r≠rank]."""
    return distributed_slot_forward_bytes(keys_to, keys_from, rank, dim) + 4 * dim * _others(
        keys_to, rank
    )


def distributed_slot_reduce_scatter_forward_bytes(
    keys_to: Sequence[int], rank: int, dim: int, bags: int, mode: str = "sum"
) -> float:
    """Distributed slots, reduce-scatter scheme (every rank brings `bags` bags): counts and
    batch sizes 16·(N-1), (key, global bag) pairs to their owners 16·Σ keys_to[r≠rank], for
    mean the bags' lengths all-gathered (N-1)/N·8·N·bags, and the partial sums [N·bags, D]
    reduce-scattered (N-1)/N·4·D·N·bags. Independent of how many keys the others send here."""
    world = len(keys_to)
    total = 16 * (world - 1) + 16 * _others(keys_to, rank)
    if mode == "mean":
        total += ring_bytes("all_gather", 8 * world * bags, world)
    return total + ring_bytes("reduce_scatter", 4 * dim * world * bags, world)


def distributed_slot_reduce_scatter_step_bytes(
    keys_to: Sequence[int], rank: int, dim: int, bags: int, mode: str = "sum"
) -> float:
    """The forward's bytes plus the backward's all-gather of the top gradients [N·bags, D]:
    (N-1)/N·4·D·N·bags."""
    world = len(keys_to)
    forward = distributed_slot_reduce_scatter_forward_bytes(keys_to, rank, dim, bags, mode)
    return forward + ring_bytes("all_gather", 4 * dim * world * bags, world)


# tensors shaped like the value table (optim.py): momentum's buffer, Adagrad's accumulator,
# Adam's two moments
OPTIMIZER_STATES = {"sgd": 0, "momentum": 1, "adagrad": 1, "adam": 2}


def embedding_state_bytes_per_rank(capacity_per_rank: int, dim: int, optimizer: str) -> int:
    """What one rank holds for its share of the embedding: the float32 value table
    [capacity_per_rank, D] and the optimizer's state (`OPTIMIZER_STATES` tensors of the same
    shape: SGD none, momentum and Adagrad one, Adam two). The hash table's slot arrays are
    not counted."""
    if optimizer not in OPTIMIZER_STATES:
        raise ValueError(f"optimizer={optimizer!r} must be one of {tuple(OPTIMIZER_STATES)}")
    return 4 * capacity_per_rank * dim * (1 + OPTIMIZER_STATES[optimizer])
