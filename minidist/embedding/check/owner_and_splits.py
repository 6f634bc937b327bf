"""Embedding checker, exercise 2: owners and all-to-all split sizes.

`check_owner_and_splits(owner, split_sizes)`: `owner(keys, world_size)` the rank of each key
under `DistributedSlotSparseEmbeddingHash`'s modulo placement, and `split_sizes(keys_per_rank,
rank, world_size)` the (send, recv) split sizes of the forward's key all-to-all on `rank`.
Named mistakes: a negative rank for a negative key (C's / `torch.fmod`'s remainder), send and
recv swapped, recv counted from this rank's own keys instead of the other ranks'.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...course.check import fail, passed
from ..distributed import key_owner

OWNER_KEYS = torch.tensor(
    [0, 1, 5, 7, -1, -2, -5, -8, 1 << 40, -(1 << 40) - 3, 12, -13], device="cpu"
)


def _batches(world: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(world)
    return [torch.randint(-50, 50, (5 + 3 * r,), device="cpu", generator=g) for r in range(world)]


def _right_splits(batches, rank, world) -> tuple[list[int], list[int]]:
    own = [torch.bincount(key_owner(b, world), minlength=world).tolist() for b in batches]
    return own[rank], [own[q][rank] for q in range(world)]


def _diagnose_owner(owner: Callable) -> str | None:
    for world in (2, 3, 4):
        got = owner(OWNER_KEYS.clone(), world)
        want = key_owner(OWNER_KEYS, world)
        if not isinstance(got, torch.Tensor):
            return f"owner returned a {type(got).__name__}; return an int64 tensor of ranks."
        got = got.to(torch.int64)
        if got.shape != want.shape:
            return f"owner gave shape {tuple(got.shape)} for {OWNER_KEYS.numel()} keys."
        if (got < 0).any():
            bad = OWNER_KEYS[got < 0][0].item()
            return (
                f"N = {world}: key {bad} got rank {got[OWNER_KEYS == bad][0].item()}, a "
                "negative rank. C, CUDA and torch.fmod keep the sign of the key; the owner "
                "must be in 0..N-1: torch.remainder (or Python's %), or ((k % N) + N) % N."
            )
        if not torch.equal(got, want):
            i = int((got != want).nonzero()[0])
            return (
                f"N = {world}: key {OWNER_KEYS[i].item()} got rank {got[i].item()}, the "
                f"modulo placement puts it on {want[i].item()} (key mod N)."
            )
    return None


def _diagnose_splits(split_sizes: Callable) -> str | None:
    for world in (2, 4):
        batches = _batches(world)
        for rank in range(world):
            got = split_sizes([b.clone() for b in batches], rank, world)
            send, recv = _right_splits(batches, rank, world)
            try:
                got_send, got_recv = ([int(x) for x in part] for part in got)
            except (TypeError, ValueError):
                return f"split_sizes returned {got!r}; return (send, recv), two lists of N ints."
            if (got_send, got_recv) == (send, recv):
                continue
            where = f"rank {rank} of N = {world}"
            if (got_send, got_recv) == (recv, send) and send != recv:
                return (
                    f"{where}: you returned (recv, send) swapped: send[q] counts this rank's "
                    "keys owned by q, recv[q] counts rank q's keys owned by this rank."
                )
            if got_send == send and got_recv == send and send != recv:
                return (
                    f"{where}: recv {got_recv} equals send: you counted this rank's own keys. "
                    f"recv[q] is what rank q sends here, the keys of rank q's batch owned by "
                    f"rank {rank}: {recv}. (In distributed.py each rank learns it from the "
                    "counts all-to-all.)"
                )
            if got_send == send:
                return (
                    f"{where}: recv {got_recv}, expected {recv}: recv[q] counts the keys of "
                    f"rank q's batch that rank {rank} owns."
                )
            return (
                f"{where}: send {got_send}, expected {send}: send[q] counts the keys of rank "
                f"{rank}'s own batch that rank q owns."
            )
    return None


def check_owner_and_splits(owner: Callable, split_sizes: Callable) -> None:
    """`owner(keys, world_size)` and `split_sizes(keys_per_rank, rank, world_size)`."""
    problem = _diagnose_owner(owner) or _diagnose_splits(split_sizes)
    if problem:
        fail(problem)
    batches = _batches(4)
    send, recv = split_sizes(batches, 0, 4)
    passed(
        f"owner agrees with key_owner on {OWNER_KEYS.numel()} keys (negative ones too) for "
        f"N = 2, 3, 4; split_sizes right on every rank of N = 2 and 4; e.g. rank 0 of 4 sends "
        f"{[int(x) for x in send]} and receives {[int(x) for x in recv]} keys"
    )
