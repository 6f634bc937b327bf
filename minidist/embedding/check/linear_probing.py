"""Embedding checker, exercise 1: linear probing (`check_linear_probing(insert, find)`).

A small open-addressing table in plain Python, a `ProbeTable` (lists `keys` and `rows`, None
for an empty slot; `home(key) = key mod num_slots`; `size` rows handed out; `capacity` =
max_load · num_slots keys). `insert(table, key)` returns the key's row (a new one,
`table.size`, for a new key) and raises `HashTableFullError` when a new key would go over
capacity, before any change; `find(table, key)` returns the row or -1. Compared with a
Python dict and with the reference probe (which slot each key lands in) on collisions, a
chain that wraps past the last slot, repeated and negative keys, a full table and random
tables. Named mistakes: no wrap-around, a wrap at num_slots - 1, a probe step of 2, a home
slot from `key & num_slots`, stopping at a slot that holds another key (find gives up, or
insert overwrites it), the same row to two keys (or a second row to one key), the slot
returned for the row, the load bound forgotten or off by one (`>=`), a full table refusing
a stored key, a table changed before the error. Every call of the learner's code is
time-limited (an endless probe fails in seconds) and its exceptions are reported with their
line and likely cause.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...course.check import CheckFailed, fail, passed
from ...pipeline.check_call import learner_call
from ..hash_table import HashTableFullError


class ProbeTable:
    """The exercise's table: `num_slots` slots, at most `capacity` keys."""

    def __init__(self, num_slots: int = 8, max_load: float = 0.75):
        self.num_slots = num_slots
        self.capacity = int(max_load * num_slots)
        self.keys: list[int | None] = [None] * num_slots
        self.rows: list[int | None] = [None] * num_slots
        self.size = 0

    def home(self, key: int) -> int:
        """The slot where `key`'s probe starts (Python's % is never negative)."""
        return key % self.num_slots

    def __repr__(self) -> str:
        cells = [
            f"{s}:{k}->{r}" for s, (k, r) in enumerate(zip(self.keys, self.rows)) if k is not None
        ]
        return f"ProbeTable(size={self.size}, capacity={self.capacity}, [{', '.join(cells)}])"


HINTS = {
    "HashTableFullError": "the capacity check is off by one: a new key is refused only when "
    "size + 1 > capacity (6 keys fit in 8 slots at max_load 0.75: `size + 1 >= capacity` "
    "refuses the 6th), and a key already stored never is",
    "IndexError": "a slot index outside 0..num_slots-1: the home slot is key mod num_slots "
    "(table.home(key); a mask would be key & (num_slots - 1), not key & num_slots) and the "
    "probe wraps with (slot + 1) % num_slots",
    "TypeError": "find(table, key) and insert(table, key) take the table first; an empty slot "
    "holds None",
    "AttributeError": "find(table, key) and insert(table, key) take the table first (a "
    "ProbeTable: keys, rows, size, capacity, num_slots, home)",
    "LearnerTimeout": "a probe that never meets an empty slot or the key: move one slot at a "
    "time, (slot + 1) % num_slots (a step of 2 visits only half the slots), and stop after "
    "num_slots slots",
}


def _insert(ins, table, key):
    return learner_call(ins, table, key, call=f"insert(table, {key}) on {table}", hints=HINTS)


def _find(fnd, table, key):
    return learner_call(fnd, table, key, call=f"find(table, {key}) on {table}", hints=HINTS)


def _run(insert, find, keys, lookups=(), num_slots=8):
    """Insert `keys` in order, then find every key and `lookups`: (table, rows, found)."""
    table = ProbeTable(num_slots)
    rows = [_insert(insert, table, k) for k in keys]
    found = {k: _find(find, table, k) for k in [*keys, *lookups]}
    return table, rows, found


def _stored(table: ProbeTable) -> dict:
    return {k: r for k, r in zip(table.keys, table.rows) if k is not None}


def probe_table(keys, num_slots=8, step=1, modulus=None, home=None) -> ProbeTable:
    """The table the reference probe (or a variant of it) builds from `keys` (distinct)."""
    table = ProbeTable(num_slots)
    wrap = modulus or num_slots
    for key in keys:
        if key in table.keys:
            continue
        slot = home(key, num_slots) if home else table.home(key)
        for _ in range(2 * num_slots):
            if 0 <= slot < num_slots and table.keys[slot] is None:
                break
            slot = (slot + step) % wrap
        else:
            return table  # the variant finds no empty slot: it cannot describe the learner
        table.keys[slot], table.rows[slot] = key, table.size
        table.size += 1
    return table


PLACEMENTS = [
    (
        dict(modulus=-1),
        "your probe wraps at num_slots - 1: slot num_slots - 1 is never "
        "reached from below (slot + 1) % (num_slots - 1); wrap with % num_slots.",
    ),
    (
        dict(step=-1),
        "your probe moves backwards (slot - 1): linear probing goes on to the "
        "next slot, (slot + 1) % num_slots; find and insert must walk the same way.",
    ),
    (
        dict(step=2),
        "your probe moves 2 slots at a time: linear probing tries the next slot, "
        "(slot + 1) % num_slots, so it reaches every slot (a step of 2 sees only half of them).",
    ),
    (
        dict(home=lambda k, n: k & n),
        "your home slot is key & num_slots, which is 0 or "
        "num_slots: the home is key mod num_slots (table.home(key); as a mask, key & "
        "(num_slots - 1)).",
    ),
]


def _placement(table: ProbeTable, keys) -> str | None:
    """Does every key sit in the slot linear probing gives it? If not, which mistake?"""
    want = probe_table(keys, table.num_slots)
    if (table.keys, table.rows) == (want.keys, want.rows):
        return None
    for switches, message in PLACEMENTS:
        switches = dict(switches)
        if switches.get("modulus") == -1:
            switches["modulus"] = table.num_slots - 1
        variant = probe_table(keys, table.num_slots, **switches)
        if table.keys == variant.keys:
            return f"after inserting {list(keys)}: {message} Your table: {table}."
    key = next(k for s, k in enumerate(want.keys) if k is not None and table.keys[s] != k)
    slot = table.keys.index(key) if key in table.keys else None
    if slot is not None and table.rows[slot] == slot and want.rows[want.keys.index(key)] != slot:
        return (
            f"after inserting {list(keys)}: key {key} has row {slot}, its slot number. The row "
            "is the next free row, table.size (0, 1, 2, ... in insert order), stored beside "
            "the key; the slot is only where the probe put it."
        )
    return (
        f"after inserting {list(keys)}: key {key} is in slot {slot}; linear probing puts it in "
        f"slot {want.keys.index(key)}, the first empty slot of home {table.home(key)}, "
        f"home + 1, ... (wrapping with % num_slots). Your table: {table}; expected {want}."
    )


def _diagnose_probing(insert: Callable, find: Callable) -> str | None:
    # Distinct keys, no collision: rows 0, 1, 2 in insert order.
    table, rows, found = _run(insert, find, [1, 2, 4], lookups=[3])
    if rows == [1, 2, 4]:
        return (
            "inserting keys 1, 2, 4 into an empty table returned [1, 2, 4], their slots: "
            "insert returns the key's row, the next free row table.size (0, 1, 2, ... in "
            "insert order), not the slot."
        )
    wrong_place = _placement(table, [1, 2, 4])
    if len(set(rows)) < len(rows):
        return (
            f"inserting keys 1, 2, 4 gave rows {rows}: two keys got the same row. A new key "
            "takes the next free row, table.size, and the size grows by one (HugeCTR's "
            "atomic counter), so rows are 0, 1, 2, ... in insert order."
        )
    if rows != [0, 1, 2]:
        return f"inserting keys 1, 2, 4 into an empty table gave rows {rows}; expected [0, 1, 2]."
    if wrong_place:
        return wrong_place
    if {k: found[k] for k in (1, 2, 4)} == {1: 1, 2: 2, 4: 4}:
        return (
            "after inserting keys 1, 2, 4 (rows 0, 1, 2) find returned 1, 2, 4, their slots: "
            "find returns the row stored beside the key, table.rows[slot]."
        )
    if {k: found[k] for k in (1, 2, 4)} != {1: 0, 2: 1, 4: 2}:
        return f"after inserting keys 1, 2, 4 find gave {found}; expected rows 0, 1, 2 and -1."
    if found[3] != -1:
        return f"find(table, 3) returned {found[3]} for a key never inserted; expected -1."
    again = _insert(insert, table, 2)
    if again != 1 or table.size != 3:
        return (
            f"inserting key 2 a second time returned row {again} (size {table.size}): a key "
            "already in the table keeps its row; insert must find it first and hand out no "
            "new row."
        )
    # Collisions: 3, 11, 19 all start at slot 3 (mod 8).
    table, rows, found = _run(insert, find, [3, 11, 19])
    stored = _stored(table)
    if 3 not in stored or 11 not in stored:
        return (
            f"after inserting 3, 11, 19 (all home slot 3) the table holds {stored}: insert "
            "overwrote a slot that held another key. A slot with a different key is not "
            "yours: probe on to the next slot until you find the key or an empty slot."
        )
    if found[11] == -1 or found[19] == -1:
        return (
            f"after inserting 3, 11, 19 (all home slot 3) find gave {found}: find stopped at "
            "slot 3, which holds key 3. Only an empty slot proves a key missing; a slot of "
            "another key means: look at the next one."
        )
    if found != {3: 0, 11: 1, 19: 2}:
        return f"after inserting 3, 11, 19, find gave {found}; expected {{3: 0, 11: 1, 19: 2}}."
    wrong_place = _placement(table, [3, 11, 19])
    if wrong_place:
        return wrong_place
    # Wrap-around: 7 and 15 start at the last slot.
    try:
        table, rows, found = _run(insert, find, [7, 15, -1], lookups=[23])
    except CheckFailed as exc:
        if "IndexError" not in str(exc):
            raise
        return (
            f"inserting 7, 15 (both home slot 7, the last): {exc} The probe must wrap round "
            "to slot 0, slot = (slot + 1) % num_slots."
        )
    if found != {7: 0, 15: 1, -1: 2, 23: -1}:
        return (
            f"inserting 7, 15, -1 (home slots 7, 7, 7) then finding them and the missing 23 "
            f"gave {found}, table {table}: the probe past the last slot must wrap round to "
            "slot 0, slot = (slot + 1) % num_slots."
        )
    wrong_place = _placement(table, [7, 15, -1])
    if wrong_place:
        return wrong_place
    # The load bound: 6 keys fit (0.75 of 8 slots), the 7th raises before any change.
    table = ProbeTable()
    for k in range(6):
        _insert(insert, table, 10 * k)
    before = (list(table.keys), list(table.rows), table.size)
    try:
        row = learner_call(
            insert, table, 99, call="insert(table, 99)", hints=HINTS, expect=HashTableFullError
        )
    except HashTableFullError:
        row = None
    if row is not None:
        return (
            f"a 7th key went into a table of capacity {table.capacity} (8 slots, max_load "
            f"0.75) and got row {row}: check size + 1 > capacity before inserting a new key "
            "and raise HashTableFullError (a full open-addressing table probes forever, and "
            "long chains come well before)."
        )
    if (list(table.keys), list(table.rows), table.size) != before:
        return "insert raised HashTableFullError but changed the table first: check, then change."
    try:
        row = learner_call(
            insert, table, 20, call="insert(table, 20)", hints=HINTS, expect=HashTableFullError
        )
    except HashTableFullError:
        return (
            "a full table raised HashTableFullError for key 20, which is already in it: a "
            "key already stored needs no new row, return it."
        )
    if row != 2:
        return f"insert(table, 20) on the full table returned {row}; key 20 has row 2."
    return None


def check_linear_probing(insert: Callable, find: Callable) -> None:
    """`insert(table, key)` and `find(table, key)` on a `ProbeTable`, against a dict."""
    problem = _diagnose_probing(insert, find)
    if problem:
        fail(problem)
    g = torch.Generator().manual_seed(0)
    for trial in range(20):  # random keys, negative too, against a dict and the probe
        table, want, keys = ProbeTable(16), {}, []
        for k in torch.randint(-40, 40, (30,), device="cpu", generator=g).tolist():
            if k not in want and len(want) == table.capacity:
                break
            want.setdefault(k, len(want))
            keys.append(k)
            row = _insert(insert, table, k)
            if row != want[k]:
                fail(
                    f"trial {trial}: insert(table, {k}) returned {row}, a dict says "
                    f"{want[k]}; table {table}"
                )
        wrong_place = _placement(table, keys)
        if wrong_place:
            fail(f"trial {trial} (16 slots): {wrong_place}")
        for k in range(-45, 45):
            got = _find(find, table, k)
            if got != want.get(k, -1):
                fail(
                    f"trial {trial}: find(table, {k}) = {got}, a dict says "
                    f"{want.get(k, -1)}; table {table}"
                )
    passed(
        "insert and find agree with a Python dict and every key sits in its linear-probing "
        "slot, on collisions, a chain wrapping past the last slot, repeated and negative "
        "keys, and 20 random tables; the 7th key of an "
        "8-slot table (max_load 0.75) raises HashTableFullError before any change"
    )
