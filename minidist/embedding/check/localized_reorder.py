"""Embedding checker, exercise 4: the localized reorder (`check_localized_reorder(reorder)`).

In `LocalizedSlotSparseEmbeddingHash` (HugeCTR docs, "LocalizedSlotSparseEmbeddingHash";
`distributed.py`) slot s lives on rank s mod N. A rank sends each of its bags to the owner of
the bag's slot, grouped by owner (owner 0's bags first), sample-major within an owner, and
the all-to-all brings the pooled vectors back in that same order. `reorder(received, batch,
slots, world_size)` puts them back in sample-major slot order: row b of the result is the
pooled vector of sample b // slots, slot b % slots (`back[argsort(bag_order)]` in
distributed.py). Each test vector holds (sample, slot), so a misplaced row says where it came
from. Named mistakes: the owner-major order returned as it came, owner chunks read slot-major
(slot, then sample), slot s placed on rank s // (slots / N) (blocks) instead of s mod N,
every owner assumed to hold slots / N slots when N does not divide the slots (and the reshape
that crashes on it), the owner of bag b taken as b mod N instead of its slot's, the
permutation gathered where it must scatter (`received[order]`), an unstable argsort (the
130-bag case shows it), the result slot-major. The learner's exceptions are reported with
their line and likely cause.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...course.check import fail, passed
from ...pipeline.check_call import learner_call

# (batch, slots, N): N divides the slots, does not, a rank without a slot, one slot, and 130
# bags (enough for torch.argsort's default, unstable sort to reorder equal owners)
CASES = [(3, 4, 2), (2, 5, 2), (3, 5, 3), (2, 3, 4), (4, 1, 2), (5, 26, 4)]
HINTS = {
    "is invalid for input of size": "a reshape that assumes every owner holds slots / N "
    "slots: when N does not divide the slots, owner q holds the slots s with s mod N = q, "
    "ceil or floor of slots / N of them, so the chunks differ in size",
    "IndexError": "an index past batch·slots: row i·slots + s for sample i, slot s",
    "TypeError": "reorder(received, batch, slots, world_size): a [batch·slots, D] tensor, "
    "then three ints",
}


def _scatter(received, order):
    out = torch.empty_like(received)
    out[order] = received
    return out


def _bags(batch, slots):
    return torch.arange(batch * slots, device="cpu")


def _slot_owner(batch, slots, world):
    return (torch.arange(batch * slots, device="cpu") % slots) % world


# Other outputs a mistake computes from what arrived: (function, message).
VARIANTS = [
    (
        lambda r, b, s, n: _scatter(r, torch.argsort(_slot_owner(b, s, n))),
        "equal owners must keep their order: torch.argsort(..., stable=True); the default sort "
        "may reorder ties (it does here, on 130 bags).",
    ),
    (
        lambda r, b, s, n: r[torch.argsort(_slot_owner(b, s, n), stable=True)],
        "you gathered, received[order], where the permutation must scatter: the bag that came "
        "back j-th is order[j], so out[order] = received (or received[argsort(order)]).",
    ),
    (
        lambda r, b, s, n: _scatter(r, torch.argsort(_bags(b, s) % n, stable=True)),
        "the owner of bag b is the owner of its slot, (b mod slots) mod N, not b mod N (the two "
        "agree only when N divides the slots).",
    ),
    (
        lambda r, b, s, n: (
            _scatter(r, torch.argsort(_slot_owner(b, s, n), stable=True))
            .reshape(b, s, -1)
            .transpose(0, 1)
            .reshape(b * s, -1)
        ),
        "your result is slot-major (row s·batch + i); the model wants sample-major slot order, "
        "row i·slots + s: sample i's slots together.",
    ),
]


def _order(batch: int, slots: int, world: int, owner: Callable, sample_major: bool = True):
    """The (sample, slot) of each received vector: owners in turn, then sample-major
    (or slot-major) within an owner."""
    pairs = [(i, s) for i in range(batch) for s in range(slots)]
    if not sample_major:
        pairs.sort(key=lambda p: p[1])
    order = [p for q in range(world) for p in pairs if owner(p[1], slots, world) == q]
    return torch.tensor(order, dtype=torch.float32, device="cpu").reshape(-1, 2)


def _modulo(s: int, slots: int, world: int) -> int:
    return s % world


def _blocks(s: int, slots: int, world: int) -> int:
    return s // -(-slots // world)


def owner_major(batch: int, slots: int, world: int) -> torch.Tensor:
    """What a rank receives: owner 0's bags first, sample-major within an owner."""
    return _order(batch, slots, world, _modulo)


def _sample_major(batch: int, slots: int) -> torch.Tensor:
    return _order(batch, slots, 1, _modulo)


def _describe(got: torch.Tensor, batch: int, slots: int) -> str:
    i = int((got != _sample_major(batch, slots)).any(1).nonzero()[0])
    sample, slot = (int(v) for v in got[i].tolist())
    return (
        f"row {i} should be sample {i // slots}, slot {i % slots}; it holds sample {sample}, "
        f"slot {slot}"
    )


def _puts_right(reorder, received, batch, slots, world) -> bool:
    """Does `reorder` put `received` (another arrival order) into sample-major order?"""
    try:
        got = learner_call(reorder, received, batch, slots, world)
    except Exception:  # noqa: BLE001 (only a diagnosis)
        return False
    return isinstance(got, torch.Tensor) and torch.equal(got, _sample_major(batch, slots))


def _gives(reorder: Callable, variant: Callable, batch: int, slots: int, world: int) -> bool:
    """Does `reorder` compute what `variant` does on this case?"""
    received = owner_major(batch, slots, world)
    try:
        got = learner_call(reorder, received.clone(), batch, slots, world)
    except Exception:  # noqa: BLE001 (only a diagnosis)
        return False
    return isinstance(got, torch.Tensor) and torch.equal(
        got, variant(received, batch, slots, world)
    )


def _diagnose(reorder: Callable) -> str | None:
    passed_divisible = False
    for batch, slots, world in CASES:
        received = owner_major(batch, slots, world)
        where = f"batch {batch}, {slots} slots, N = {world}"
        call = f"reorder(received, {batch}, {slots}, {world})"
        got = learner_call(reorder, received.clone(), batch, slots, world, call=call, hints=HINTS)
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (batch * slots, 2):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            return f"{where}: reorder returned {shape}; expected a tensor [batch·slots, D]."
        if torch.equal(got, _sample_major(batch, slots)):
            passed_divisible |= slots % world == 0
            continue
        if torch.equal(got, received):
            return (
                f"{where}: you returned the vectors in the order they arrived: owner 0's bags, "
                "then owner 1's, ... Put the vector of (sample i, slot s) at row i·slots + s."
            )
        wrong = f"{where}: {_describe(got, batch, slots)}."
        for variant, message in VARIANTS:  # the variant that matches every case
            if torch.equal(got, variant(received, batch, slots, world)) and all(
                _gives(reorder, variant, *case) for case in CASES
            ):
                return f"{wrong} {message}"
        if _puts_right(reorder, _order(batch, slots, world, _modulo, False), batch, slots, world):
            return (
                f"{wrong} Within one owner the vectors come sample-major (sample 0's slots of "
                "that owner, then sample 1's, ...), not slot-major."
            )
        if _puts_right(reorder, _order(batch, slots, world, _blocks), batch, slots, world):
            return (
                f"{wrong} Slot s lives on rank s mod N, not in blocks of ceil(slots / N) "
                "consecutive slots."
            )
        if passed_divisible and slots % world:
            held = [len(range(q, slots, world)) for q in range(world)]
            return (
                f"{wrong} Owner q holds the slots s with s mod N = q: when N does not divide "
                f"the slots the owners hold different numbers of them (here {held} slots), "
                "so their chunks differ in size."
            )
        return f"{wrong} Owner q's chunk holds slots q, q + N, ... of every sample, sample-major."
    return None


def check_localized_reorder(reorder: Callable) -> None:
    """`reorder(received, batch, slots, world_size)` against the sample-major slot order."""
    problem = _diagnose(reorder)
    if problem:
        fail(problem)
    g = torch.Generator().manual_seed(0)
    for batch, slots, world in [(5, 26, 4), (7, 13, 3)]:  # real vectors, D = 8
        pooled = torch.randn(batch * slots, 8, device="cpu", generator=g)
        bag_owner = (torch.arange(batch * slots, device="cpu") % slots) % world
        received = pooled[torch.argsort(bag_owner, stable=True)]
        if not torch.equal(reorder(received, batch, slots, world), pooled):
            fail(f"batch {batch}, {slots} slots, N = {world}, D = 8: rows out of place.")
    passed(
        f"the pooled vectors are back in sample-major slot order for {len(CASES) + 1} layouts "
        "(N dividing the slots or not, a rank with no slot, one slot, 26 slots on 4 ranks)"
    )
