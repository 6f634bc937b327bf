"""The torch back end of `hash_table.HashTable`: linear probing run lane-parallel, in rounds.

It works on the slot arrays it is given (`slots.py` says what they hold): `slot_keys`,
`slot_rows` and, for insert, the row counter; `num_slots` is `slot_rows.numel()`.

The Triton kernels (`kernels.py`) give every key a lane that loops until its probe ends; here
the lanes advance together, one tensor op per step for all of them (Alcantara et al. 2009,
"Real-time parallel hashing on the GPU", the same scheme run as rounds):

- find: every key reads its home slot `fmix64(key) & mask` (`_CHUNK` keys per pass, so the
  temporaries stay in cache); only the keys whose home holds another key (about 1/5 at load
  0.5) go on, and each round works on the lanes still probing alone (compacted by index,
  no boolean masks); once at most `_TAIL_LANES` lanes are left on long chains, a round reads
  `_TAIL_SLOTS` slots of each, so a chain of 40 slots costs a few rounds, not 40. Rounds
  track slots, not rows: one gather of the final slots' rows ends it (an empty slot's row
  is -1, a missing key's answer).
- insert: lanes that read the same empty slot contend and the lowest lane wins, as the first
  CAS would; a scatter-min into a slot-sized array picks it (no sort per round). The
  winners' rows are handed out in slot order, and a lane that loses reads its slot again
  next round (tests/test_embedding_hash.py checks the tables, slot for slot, against a plain
  boolean-mask reference of these rounds).

Measured on a 2-core CPU, one thread, 2^18 keys at load 0.5 (`python -m minidist bench
embedding`): find about 7x a Python dict (the boolean-mask reference: 1.9x), insert about
1.2x (0.6x); a find's time goes to random gathers from the slot arrays (~40%),
`nonzero` compactions (~20%) and the hash's ten elementwise passes (~20%).
"""

from __future__ import annotations

import torch

from .slots import _FMIX_C1, _FMIX_C2, _LOW31, EMPTY_KEY, fmix64

# keys per first-probe pass; lanes left when probing turns to windows of _TAIL_SLOTS slots
_CHUNK, _TAIL_LANES, _TAIL_SLOTS = 1 << 16, 1024, 32
# a claim array per insert up to _CLAIM_SLOTS slots (512 KiB), or for a batch of at least
# 1/_CLAIM_BATCH of the slots; else a sort of the wanted slots
_CLAIM_SLOTS, _CLAIM_BATCH = 1 << 16, 16


def _home_slots(keys: torch.Tensor, mask: int, out: torch.Tensor) -> torch.Tensor:
    """`fmix64(keys) & mask` into `out`, in place; below 2^31 the last shift needs no mask."""
    if mask >= 1 << 31:
        return torch.bitwise_and(fmix64(keys), mask, out=out)
    k = torch.bitwise_right_shift(keys, 33, out=out)
    k &= _LOW31
    k ^= keys
    k *= _FMIX_C1
    tmp = k >> 33
    tmp &= _LOW31
    k ^= tmp
    k *= _FMIX_C2
    k ^= torch.bitwise_right_shift(k, 33, out=tmp)
    return k.bitwise_and_(mask)


def torch_find(slot_keys: torch.Tensor, slot_rows: torch.Tensor, keys: torch.Tensor):
    """Lane-parallel linear probing that tracks slots, not rows: every key reads its home
    slot (`_CHUNK` keys at a time, so the temporaries stay in cache); the keys whose home
    holds another key (about 1/5 at load 0.5) probe on in `_probe_on`; one gather of the
    final slots' rows ends it (an empty slot's row is -1)."""
    mask, n = slot_rows.numel() - 1, keys.numel()
    slots, lanes = torch.empty_like(keys), []
    for i in range(0, max(n, 1), _CHUNK):
        part, home = (
            keys[i : i + _CHUNK],
            _home_slots(keys[i : i + _CHUNK], mask, slots[i : i + _CHUNK]),
        )
        lanes.append((slot_keys.index_select(0, home) != part).nonzero().view(-1).add_(i))
    lanes = torch.cat(lanes)
    if lanes.numel():
        start = slots.index_select(0, lanes).add_(1).bitwise_and_(mask)
        slots.index_copy_(0, lanes, _probe_on(slot_keys, mask, keys.index_select(0, lanes), start))
    return slot_rows.index_select(0, slots)


def _probe_on(slot_keys: torch.Tensor, mask: int, keys: torch.Tensor, slot: torch.Tensor):
    """The slot where each key's probe from `slot` ends: its own, or an empty one. One slot
    per round for the lanes still probing, then `_TAIL_SLOTS` slots per round once at most
    `_TAIL_LANES` lanes are left on long chains (a few ops per round, not per slot)."""
    end, lanes = None, None  # lanes: positions in `keys` of the lanes still probing
    while keys.numel() > _TAIL_LANES:
        stored = slot_keys.index_select(0, slot)
        go = stored != keys
        go &= stored != EMPTY_KEY
        keep = go.nonzero().view(-1)
        if lanes is None:
            end, lanes = slot, keep
        else:
            end.index_copy_(0, lanes, slot)
            lanes = lanes.index_select(0, keep)
        keys, slot = (
            keys.index_select(0, keep),
            slot.index_select(0, keep).add_(1).bitwise_and_(mask),
        )
    if lanes is None:
        end, lanes = torch.empty_like(keys), torch.arange(keys.numel(), device=keys.device)
    window = torch.arange(_TAIL_SLOTS, device=keys.device)[:, None]
    while keys.numel():  # [_TAIL_SLOTS, lanes]; a present key lies before any empty slot
        at = (slot + window).bitwise_and_(mask)
        stored = slot_keys.index_select(0, at.view(-1)).view(_TAIL_SLOTS, -1)
        own = torch.where(stored == keys, at, -1).amax(0)
        stop = torch.where(own >= 0, own, torch.where(stored == EMPTY_KEY, at, -1).amax(0))
        end.index_copy_(0, lanes, stop)
        keep = (stop < 0).nonzero().view(-1)
        lanes, keys = lanes.index_select(0, keep), keys.index_select(0, keep)
        slot = slot.index_select(0, keep).add_(_TAIL_SLOTS).bitwise_and_(mask)
    return end


def torch_insert(slot_keys, slot_rows, counter, keys: torch.Tensor, rows_in: torch.Tensor | None):
    """Rounds over the lanes still probing, as the kernel's CAS loop: lanes reading an empty
    slot contend and the lowest lane wins it (`_lowest_contender`); the winners' new rows go
    out in slot order; lanes reading another key move to the next slot, and losers read
    their slot again next round. A small batch costs O(keys), not O(slots)."""
    num_slots, n, dev = slot_rows.numel(), keys.numel(), keys.device
    mask, rows = num_slots - 1, torch.empty_like(keys)
    # a slot-sized claim array pays off for small tables and big batches: small batches
    # into big tables sort their wanted slots instead
    big = num_slots > _CLAIM_SLOTS and _CLAIM_BATCH * n < num_slots
    claim = None if big else torch.full((num_slots,), n, device=dev)
    lanes, slot = torch.arange(n, device=dev), _home_slots(keys, mask, torch.empty_like(keys))
    while lanes.numel():
        empty = slot_keys.index_select(0, slot) == EMPTY_KEY
        at = empty.nonzero().view(-1)
        contenders, wanted = lanes.index_select(0, at), slot.index_select(0, at)
        won = at.index_select(0, _lowest_contender(wanted, contenders, claim, n))
        winners, won_slots = lanes.index_select(0, won), slot.index_select(0, won)
        if rows_in is None:
            slot_rows.index_copy_(
                0,
                _ascending(won_slots, num_slots),
                counter + torch.arange(won.numel(), device=dev),
            )
            counter += won.numel()  # in place: the table's counter
            got = slot_rows.index_select(0, won_slots)
        else:
            got = rows_in.index_select(0, winners)
            slot_rows.index_copy_(0, won_slots, got)
        slot_keys.index_copy_(0, won_slots, keys.index_select(0, winners))
        rows.index_copy_(0, winners, got)
        slot.add_(~empty).bitwise_and_(mask)  # another key sits here: probe the next slot
        going = torch.ones_like(empty).index_fill_(0, won, False).nonzero().view(-1)
        lanes, slot = lanes.index_select(0, going), slot.index_select(0, going)
    return rows


def _lowest_contender(wanted, contenders, claim, n: int) -> torch.Tensor:
    """Positions of the contenders that win their slot: the lowest lane of each slot. With a
    slot-sized `claim` array, a scatter-min into it (no sort); without, the same minimum per
    distinct slot after a sort of the wanted slots (O(k log k) for k contenders)."""
    if claim is not None:
        claim.scatter_reduce_(0, wanted, contenders, "amin")
        return (claim.index_select(0, wanted) == contenders).nonzero().view(-1)
    distinct, which = torch.unique(wanted, return_inverse=True)
    lowest = torch.full_like(distinct, n).scatter_reduce_(0, which, contenders, "amin")
    return (lowest.index_select(0, which) == contenders).nonzero().view(-1)


def _ascending(slots: torch.Tensor, num_slots: int) -> torch.Tensor:
    """Distinct `slots` sorted: by a sort when few, by marking a slot-sized array when many."""
    if 16 * slots.numel() < num_slots:
        return slots.sort().values
    marks = torch.zeros(num_slots, dtype=torch.bool, device=slots.device)
    return marks.index_fill_(0, slots, True).nonzero().view(-1)
