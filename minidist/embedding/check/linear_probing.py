"""Embedding checker, exercise 1: linear probing (`check_linear_probing(insert, find)`).

A small open-addressing table in plain Python, a `ProbeTable` (lists `keys` and `rows`, None
for an empty slot; `home(key) = key mod num_slots`; `size` rows handed out; `capacity` =
max_load · num_slots keys). `insert(table, key)` returns the key's row (a new one,
`table.size`, for a new key) and raises `HashTableFullError` when a new key would go over
capacity, before any change; `find(table, key)` returns the row or -1. Compared with a
Python dict on collisions, a chain that wraps past the last slot, repeated and negative keys,
a full table. Named mistakes: no wrap-around, stopping at a slot that holds another key (find
gives up, or insert overwrites it), the same row to two keys (or a second row to one key),
the load bound forgotten.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...course.check import fail, passed
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


def _run(insert, find, keys, lookups=()):
    """Insert `keys` in order, then find every key and `lookups`: (table, rows, found)."""
    table = ProbeTable()
    rows = [insert(table, k) for k in keys]
    found = {k: find(table, k) for k in [*keys, *lookups]}
    return table, rows, found


def _stored(table: ProbeTable) -> dict:
    return {k: r for k, r in zip(table.keys, table.rows) if k is not None}


def _diagnose_probing(insert: Callable, find: Callable) -> str | None:
    # Distinct keys, no collision: rows 0, 1, 2 in insert order.
    table, rows, found = _run(insert, find, [1, 2, 4], lookups=[3])
    if len(set(rows)) < len(rows):
        return (
            f"inserting keys 1, 2, 4 gave rows {rows}: two keys got the same row. A new key "
            "takes the next free row, table.size, and the size grows by one (HugeCTR's "
            "atomic counter), so rows are 0, 1, 2, ... in insert order."
        )
    if rows != [0, 1, 2]:
        return f"inserting keys 1, 2, 4 into an empty table gave rows {rows}; expected [0, 1, 2]."
    if found[3] != -1:
        return f"find(table, 3) returned {found[3]} for a key never inserted; expected -1."
    again = insert(table, 2)
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
    # Wrap-around: 7 and 15 start at the last slot.
    try:
        table, rows, found = _run(insert, find, [7, 15, -1], lookups=[23])
    except IndexError as exc:
        return (
            f"inserting 7, 15 (both home slot 7, the last) raised IndexError ({exc}): the "
            "probe must wrap round to slot 0, slot = (slot + 1) % num_slots."
        )
    if found != {7: 0, 15: 1, -1: 2, 23: -1}:
        return (
            f"inserting 7, 15, -1 (home slots 7, 7, 7) then finding them and the missing 23 "
            f"gave {found}, table {table}: the probe past the last slot must wrap round to "
            "slot 0, slot = (slot + 1) % num_slots."
        )
    # The load bound: 6 keys fit (0.75 of 8 slots), the 7th raises before any change.
    table = ProbeTable()
    for k in range(6):
        insert(table, 10 * k)
    before = (list(table.keys), list(table.rows), table.size)
    try:
        row = insert(table, 99)
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
        row = insert(table, 20)
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
    for trial in range(20):  # random keys, negative too, against a Python dict
        table, want = ProbeTable(16), {}
        for k in torch.randint(-40, 40, (30,), device="cpu", generator=g).tolist():
            if k not in want and len(want) == table.capacity:
                break
            want.setdefault(k, len(want))
            if insert(table, k) != want[k]:
                fail(f"trial {trial}: insert(table, {k}) disagrees with a dict; table {table}")
        for k in range(-45, 45):
            if find(table, k) != want.get(k, -1):
                fail(f"trial {trial}: find(table, {k}) = {find(table, k)}, dict says "
                     f"{want.get(k, -1)}; table {table}")  # fmt: skip
    passed(
        "insert and find agree with a Python dict on collisions, a chain wrapping past the "
        "last slot, repeated and negative keys, and 20 random tables; the 7th key of an "
        "8-slot table (max_load 0.75) raises HashTableFullError before any change"
    )
