"""The bytes HugeCTR's two placements send, as functions (lesson 11, in progress).

Counted as `minidist.comm` records an all-to-all: what this rank sends to the other ranks
(its own chunk stays). Keys are int64 (8 bytes), vectors float32 (4 bytes per element).
Forward only; the backward all-to-all of the vectors' gradients sends what the forward
received back, the same bytes as the forward's vector all-to-all in the other direction.
"""

from __future__ import annotations

from collections.abc import Sequence


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


def distributed_slot_step_bytes(
    keys_to: Sequence[int], keys_from: Sequence[int], rank: int, dim: int
) -> int:
    """Distributed slots, one training step: the forward's bytes plus the backward's
    all-to-all, which returns the gradient of every vector this rank received to its owner,
    4·D·Σ keys_to[r≠rank]."""
    return distributed_slot_forward_bytes(keys_to, keys_from, rank, dim) + 4 * dim * _others(
        keys_to, rank
    )


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
