"""The hash table of lesson 11 against a Python dict, on both back ends.

The Triton back end runs its kernels under TRITON_INTERPRET=1 (conftest.py); examples stay
few and small because the interpreter runs programs one after another.
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minidist.embedding.hash_table import (
    EMPTY_KEY,
    HashTable,
    HashTableFullError,
    fmix64,
    resolve_backend,
)

BACKENDS = ["triton", "torch"]
INT64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)


def assert_like_dict(table: HashTable, batches: list[list[int]]) -> dict[int, int]:
    """Insert the batches one after another and check every promise against a dict that
    remembers the first row each key got."""
    seen: dict[int, int] = {}
    for batch in batches:
        rows = table.insert(torch.tensor(batch, dtype=torch.int64)).tolist()
        for key, row in zip(batch, rows):
            assert seen.setdefault(key, row) == row, f"key {key} moved from {seen[key]} to {row}"
    assert table.size == len(seen)
    assert sorted(seen.values()) == list(range(len(seen)))  # distinct rows, exactly 0..U-1
    if seen:
        keys = torch.tensor(list(seen), dtype=torch.int64)
        assert table.find(keys).tolist() == list(seen.values())
        dump_keys, dump_rows = table.items()
        assert dump_keys.tolist() == sorted(seen)
        assert dump_rows.tolist() == [seen[k] for k in sorted(seen)]
    return seen


@pytest.mark.parametrize("backend", BACKENDS)
def test_duplicates_negatives_and_multiples_of_the_slot_count(backend):
    table = HashTable(200, backend=backend)
    n = table.num_slots
    batch = [7, 7, -7, 0, 0, n, 2 * n, -n, 3 * n, 7, EMPTY_KEY, (1 << 63) - 1, EMPTY_KEY, -1]
    seen = assert_like_dict(table, [batch, [k * n for k in range(-40, 40)], batch])
    assert len(seen) == 10 + 80 - 5  # 0, n, 2n, -n, 3n are in both
    missing = torch.tensor([8, -8, 5 * n + 1, 1000 * n], dtype=torch.int64)
    assert table.find(missing).tolist() == [-1, -1, -1, -1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_full_block_of_colliding_keys(backend):
    # 1000 keys in one launch, many of them contending for the same slots.
    table = HashTable(1500, backend=backend)
    keys = torch.randint(-(1 << 62), 1 << 62, (1000,), generator=torch.Generator().manual_seed(0))
    assert_like_dict(table, [keys.tolist() + keys[:300].tolist()])
    assert table.load_factor <= 0.75


def test_back_ends_hash_alike():
    """A table filled by torch is read by the Triton kernels: the same fmix64 slots."""
    keys = torch.arange(-300, 300, 3, dtype=torch.int64) * 1024
    table = HashTable(300, backend="torch")
    rows = table.insert(keys)
    table.backend = "triton"
    assert torch.equal(table.find(keys), rows)
    assert fmix64(torch.tensor([0])).item() == 0  # fmix64 fixes 0: the slot of key 0 is 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_overflow_raises_before_any_change_and_grow_keeps_rows(backend):
    table = HashTable(10, backend=backend)
    first = table.insert(torch.arange(8, dtype=torch.int64))
    slots_before = table._slot_keys.clone()
    with pytest.raises(HashTableFullError, match="capacity=10"):
        table.insert(torch.arange(5, 13, dtype=torch.int64))  # 5 new keys, 3 places left
    assert table.size == 8 and torch.equal(table._slot_keys, slots_before)
    table.grow()
    assert table.capacity == 20 and table.num_slots >= 20 / 0.75
    assert torch.equal(table.find(torch.arange(8, dtype=torch.int64)), first)
    assert_like_dict(table, [list(range(0, 20))])
    with pytest.raises(HashTableFullError, match="capacity=20"):
        table.insert(torch.tensor([-1], dtype=torch.int64))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="capacity=0"):
        HashTable(0)
    with pytest.raises(ValueError, match="max_load=1"):
        HashTable(4, max_load=1)
    with pytest.raises(ValueError, match="backend='cuda'"):
        HashTable(4, backend="cuda")
    table = HashTable(4)
    with pytest.raises(TypeError, match="keys must be an int64 tensor, got torch.int32"):
        table.insert(torch.tensor([1], dtype=torch.int32))
    with pytest.raises(ValueError, match="new_capacity=3"):
        table.grow(3)
    assert resolve_backend(None, torch.device("cpu")) == "torch"
    assert resolve_backend(None, torch.device("cuda")) == "triton"


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(st.lists(INT64 | st.integers(-20, 20), max_size=40), max_size=3))
def test_property_like_a_dict(backend, batches):
    capacity = max(1, len({k for b in batches for k in b}))
    assert_like_dict(HashTable(capacity, backend=backend), batches)


# -- the torch back end against a plain reference: same tables, slot for slot ------------


def reference_insert(table: HashTable, keys: torch.Tensor, rows_in=None) -> torch.Tensor:
    """The torch back end's insert written plainly (one boolean mask per step): distinct
    absent keys, lanes in rounds, the lowest lane wins an empty slot, new rows in slot order
    (or `rows_in`, a rehash), lanes reading another key move on, losers read their slot
    again."""
    mask, n = table.num_slots - 1, keys.numel()
    slot, rows, active = fmix64(keys) & mask, torch.full_like(keys, -1), torch.arange(n)
    while active.numel():
        s = slot[active]
        empty = table._slot_keys[s] == EMPTY_KEY
        won_slots, which = torch.unique(s[empty], return_inverse=True)
        winners = torch.full_like(won_slots, n).scatter_reduce_(0, which, active[empty], "amin")
        if rows_in is None:
            new_rows = table._counter + torch.arange(winners.numel())
            table._counter += winners.numel()
        else:
            new_rows = rows_in[winners]
        table._slot_keys[won_slots], table._slot_rows[won_slots] = keys[winners], new_rows
        rows[winners] = new_rows
        slot[active[~empty]] = (s[~empty] + 1) & mask
        active = active[rows[active] < 0]
    return rows


def reference_find(table: HashTable, keys: torch.Tensor) -> torch.Tensor:
    mask = table.num_slots - 1
    slot, rows, active = fmix64(keys) & mask, torch.full_like(keys, -1), torch.arange(keys.numel())
    while active.numel():
        stored = table._slot_keys[slot[active]]
        hit = stored == keys[active]
        rows[active[hit]] = table._slot_rows[slot[active[hit]]]
        active = active[~hit & (stored != EMPTY_KEY)]
        slot[active] = (slot[active] + 1) & mask
    return rows


def colliding_keys(num_slots: int, count: int, homes: int, seed: int) -> torch.Tensor:
    """`count` distinct keys whose home slots fall among `homes` neighbouring slots: long
    linear-probing chains that wrap around the end of the slot array."""
    g = torch.Generator().manual_seed(seed)
    pool = torch.randint(-(1 << 62), 1 << 62, (200 * count,), generator=g).unique()
    offset = (fmix64(pool) - (num_slots - homes // 2)) & (num_slots - 1)
    return pool[offset < homes][:count]


@pytest.mark.parametrize(
    "chunk, tail_lanes, tail_slots, claim",
    [(1 << 16, 1024, 32, True), (64, 8, 4, True), (64, 8, 4, False)],
)
def test_torch_back_end_equals_the_reference(monkeypatch, chunk, tail_lanes, tail_slots, claim):
    """Insert, find and grow give the reference's slots and rows exactly, on tables with long
    chains that wrap, missing and negative keys, EMPTY_KEY and duplicates; small pass and
    tail sizes send every path (several passes, probe rounds, windows) through it, and
    contention is resolved by the claim array or by sorting the wanted slots alike."""
    import minidist.embedding.probing as probing

    if not claim:  # the path of small batches into big tables, on every batch
        monkeypatch.setattr(probing, "_CLAIM_SLOTS", 0)
        monkeypatch.setattr(probing, "_CLAIM_BATCH", 0)
    monkeypatch.setattr(probing, "_CHUNK", chunk)
    monkeypatch.setattr(probing, "_TAIL_LANES", tail_lanes)
    monkeypatch.setattr(probing, "_TAIL_SLOTS", tail_slots)
    g = torch.Generator().manual_seed(0)
    table, ref = HashTable(1500, backend="torch"), HashTable(1500, backend="torch")
    n = table.num_slots
    chains = colliding_keys(n, 400, 24, seed=1)  # 400 keys over 24 home slots
    spread = torch.randint(-(1 << 63), (1 << 63) - 1, (700,), generator=g)
    batches = [chains[:250], torch.cat([spread, chains, torch.arange(-40, 40) * n, spread[:99]])]
    for batch in batches:
        rows = table.insert(batch)
        uniq = batch.unique()
        reference_insert(ref, uniq[reference_find(ref, uniq) < 0])
        assert torch.equal(table._slot_keys, ref._slot_keys)
        assert torch.equal(table._slot_rows, ref._slot_rows)
        assert torch.equal(rows, reference_find(ref, batch))
    missing = torch.cat([colliding_keys(n, 600, 24, seed=2), spread ^ 1, torch.tensor([EMPTY_KEY])])
    queries = torch.cat([missing, batches[1]])
    queries = queries[torch.randperm(queries.numel(), generator=g)]
    assert torch.equal(table.find(queries), reference_find(ref, queries))
    size = table.size
    row = reference_find(ref, chains[:1]).item()
    assert table.insert(torch.tensor([EMPTY_KEY, chains[0], EMPTY_KEY])).tolist() == [
        size,
        row,
        size,
    ]
    assert table.find(queries).tolist() == [
        size if q == EMPTY_KEY else r
        for q, r in zip(queries.tolist(), reference_find(ref, queries).tolist())
    ]
    used = ref._slot_keys[:-1] != EMPTY_KEY  # grow() rehashes in slot order, rows kept
    keys, rows = ref._slot_keys[:-1][used], ref._slot_rows[used]
    table.grow()
    ref = HashTable(table.capacity, backend="torch")
    assert torch.equal(reference_insert(ref, keys, rows), rows)
    assert torch.equal(table._slot_keys, ref._slot_keys)
    assert torch.equal(table._slot_rows, ref._slot_rows)


def test_a_small_insert_into_a_huge_table_allocates_nothing_table_sized():
    """4 keys into 2M slots: no allocation anywhere near the slot arrays' 16 MiB (it was one
    slot-sized claim array per insert); the 3 new keys get rows 1000..1002 and are found."""
    from torch.profiler import ProfilerActivity, profile

    table = HashTable(1_500_000, backend="torch")
    table.insert(torch.arange(1000, dtype=torch.int64))
    keys = torch.tensor([10**9, -(10**9), 7, 10**9 + 1])  # 7 is already there
    row_of_7 = int(table.find(keys[2:3]))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        rows = table.insert(keys)
    assert max(e.cpu_memory_usage for e in prof.events()) < 64 * 1024
    assert sorted(rows[[0, 1, 3]].tolist()) == [1000, 1001, 1002] and rows[2] == row_of_7
    assert torch.equal(table.find(keys), rows) and table.size == 1003
