"""Embedding checker, exercise 2: owners and all-to-all split sizes.

`check_owner_and_splits(owner, split_sizes)`: `owner(keys, world_size)` the rank of each key
under `DistributedSlotSparseEmbeddingHash`'s modulo placement, and `split_sizes(keys_per_rank,
rank, world_size)` the (send, recv) split sizes of the forward's key all-to-all on `rank`.
Named mistakes: a negative rank for a negative key (C's / `torch.fmod`'s remainder), abs(key)
mod N, a mask key & (N-1) (mod only for N a power of two), int32 keys (the high bits lost),
float ranks; split sizes shorter than N (`torch.bincount` without `minlength`: a batch where
the last ranks own nothing shows it), bincount of negative owners, distinct keys counted
where every occurrence travels, send and recv swapped, recv counted from this rank's own
keys instead of the other ranks', recv as the keys this rank owns in all batches. The
learner's exceptions are reported with their line and likely cause.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...course.check import fail, passed
from ...pipeline.check_call import learner_call
from ..distributed import key_owner

OWNER_KEYS = torch.tensor(
    [0, 1, 5, 7, -1, -2, -5, -8, 1 << 40, -(1 << 40) - 3, 12, -13], device="cpu"
)


HINTS = {
    "non-negative": "torch.bincount of negative owners: an owner computed with torch.fmod (or "
    "C's %) keeps the key's sign; use torch.remainder (or owner(keys, N))",
    "IndexError": "a list of N counts indexed by an owner outside 0..N-1 (a negative owner "
    "from torch.fmod?), or fewer than N counts",
    "TypeError": "owner(keys, world_size) gets an int64 tensor; split_sizes(keys_per_rank, "
    "rank, world_size) a list of N such tensors",
}
# Every rank's keys, repeated keys too; in the second set the last ranks own none of rank
# 0's keys (so `torch.bincount(owners)` without minlength is too short).
SKEWED = [[0, 1, 5, -3, 5, 1], [2, 6, 10, 6], [3, 7, -1], [4, 8, 4]]


def _batches(world: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(world)
    return [torch.randint(-50, 50, (5 + 3 * r,), device="cpu", generator=g) for r in range(world)]


def _key_sets():
    yield 2, _batches(2)
    yield 4, _batches(4)
    yield 4, [torch.tensor(k, device="cpu") for k in SKEWED]
    yield 3, [torch.tensor(k, device="cpu") for k in SKEWED[:3]]


def _right_splits(batches, rank, world) -> tuple[list[int], list[int]]:
    own = [torch.bincount(key_owner(b, world), minlength=world).tolist() for b in batches]
    return own[rank], [own[q][rank] for q in range(world)]


OWNER_MISTAKES = [
    (
        lambda k, n: k.abs() % n,
        "you took abs(key) mod N, which is what HugeCTR's data "
        "reader does (std::abs of C's remainder); this exercise, like the library's key_owner, "
        "wants the modulo in 0..N-1 (torch.remainder, Python's %): -1 on rank N-1, not 1",
    ),
    (
        lambda k, n: k & (n - 1),
        "a mask key & (N-1) equals key mod N only when N is a power "
        "of two; for N = 3 use torch.remainder(keys, N)",
    ),
    (
        lambda k, n: torch.remainder(k.to(torch.int32), n),
        "the keys went through int32: 64-bit "
        "keys lose their high bits (1 << 40 becomes 0); keep int64",
    ),
]


def _diagnose_owner(owner: Callable) -> str | None:
    for world in (2, 3, 4):
        call = f"owner({OWNER_KEYS.tolist()}, {world})"
        got = learner_call(owner, OWNER_KEYS.clone(), world, call=call, hints=HINTS)
        want = key_owner(OWNER_KEYS, world)
        if not isinstance(got, torch.Tensor):
            return f"owner returned a {type(got).__name__}; return an int64 tensor of ranks."
        if got.shape != want.shape:
            return f"owner gave shape {tuple(got.shape)} for {OWNER_KEYS.numel()} keys."
        if got.is_floating_point():
            return (
                f"owner returned a {got.dtype} tensor: ranks are integers (int64), and a float "
                "cannot even hold every 64-bit key exactly; use torch.remainder on the int64 keys."
            )
        if got.dtype != torch.int64:
            return (
                f"owner returned a {got.dtype} tensor; return int64 ranks, the keys' own dtype "
                "(the ranks index and count the keys next, and int32 or smaller breaks at scale)."
            )
        if (got < 0).any():
            bad = OWNER_KEYS[got < 0][0].item()
            return (
                f"N = {world}: key {bad} got rank {got[OWNER_KEYS == bad][0].item()}, a "
                "negative rank. C, CUDA and torch.fmod keep the sign of the key; the owner "
                "must be in 0..N-1: torch.remainder (or Python's %), or ((k % N) + N) % N."
            )
        if not torch.equal(got, want):
            i = int((got != want).nonzero()[0])
            example = (
                f"N = {world}: key {OWNER_KEYS[i].item()} got rank {got[i].item()}, the modulo "
                f"placement puts it on {want[i].item()} (key mod N)"
            )
            for formula, message in OWNER_MISTAKES:
                if torch.equal(got, formula(OWNER_KEYS, world)):
                    return f"{example}: {message}."
            return f"{example}."
    return None


def _diagnose_splits(split_sizes: Callable) -> str | None:
    for world, batches in _key_sets():
        for rank in range(world):
            call = f"split_sizes({[b.tolist() for b in batches]}, {rank}, {world})"
            got = learner_call(
                split_sizes, [b.clone() for b in batches], rank, world, call=call, hints=HINTS
            )
            send, recv = _right_splits(batches, rank, world)
            try:
                got_send, got_recv = ([int(x) for x in part] for part in got)
            except (TypeError, ValueError):
                return f"split_sizes returned {got!r}; return (send, recv), two lists of N ints."
            if not all(
                isinstance(part, list | tuple) and all(type(x) is int for x in part) for part in got
            ):
                kinds = sorted({type(part).__name__ for part in got})
                return (
                    f"split_sizes returned {kinds} for (send, recv); return two lists of Python "
                    "ints (counts.tolist()): comm.all_to_all takes its split sizes as lists."
                )
            if (got_send, got_recv) == (send, recv):
                continue
            where = f"rank {rank} of N = {world}, keys per rank {[b.tolist() for b in batches]}"
            short = [
                name for name, part in (("send", got_send), ("recv", got_recv)) if len(part) < world
            ]
            if short:
                return (
                    f"{where}: {' and '.join(short)} has fewer than N = {world} entries "
                    f"({got_send}, {got_recv}): torch.bincount returns max(owner) + 1 counts, "
                    f"so the ranks after the last owner present are missing. Pass "
                    f"minlength=world_size. Expected send {send}, recv {recv}."
                )
            distinct = _right_splits([b.unique() for b in batches], rank, world)
            if (got_send, got_recv) == distinct and distinct != (send, recv):
                return (
                    f"{where}: you counted distinct keys; every key occurrence travels to its "
                    f"owner (the owner pools each bag's keys, repeats included): send {send}, "
                    f"recv {recv}."
                )
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
            total = [
                sum(_right_splits(batches, q, world)[0][r] for q in range(world))
                for r in range(world)
            ]
            if got_send == send and got_recv == total and total != recv:
                return (
                    f"{where}: recv {got_recv} counts, for each rank q, all the keys q owns; "
                    f"recv[q] is what rank q sends to rank {rank}: the keys of rank q's batch "
                    f"that rank {rank} owns: {recv}."
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
        f"N = 2, 3, 4; split_sizes right on every rank of 4 key sets (N = 2, 3, 4, one where the "
        f"last ranks own none of a rank's keys); e.g. rank 0 of 4 sends "
        f"{[int(x) for x in send]} and receives {[int(x) for x in recv]} keys"
    )
