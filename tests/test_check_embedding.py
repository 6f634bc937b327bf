"""The hash-embedding checkers pass right answers and name the mistake in wrong ones."""

import pytest
import torch

from minidist.course.check import CheckFailed
from minidist.embedding import HashTableFullError
from minidist.embedding.check import check_linear_probing, check_owner_and_splits

# -- exercise 1: linear probing ---------------------------------------------------------------


def find_right(table, key):
    slot = table.home(key)
    for _ in range(table.num_slots):
        if table.keys[slot] is None:
            return -1
        if table.keys[slot] == key:
            return table.rows[slot]
        slot = (slot + 1) % table.num_slots
    return -1


def insert_right(table, key, *, wrap=True, bound=True, overwrite=False, same_row=False):
    row = find_right(table, key) if wrap else find_no_wrap(table, key)
    if row >= 0:
        return row
    if bound and table.size + 1 > table.capacity:
        raise HashTableFullError(f"capacity {table.capacity}")
    slot = table.home(key)
    while table.keys[slot] is not None and not overwrite:
        slot = (slot + 1) % table.num_slots if wrap else slot + 1
    table.keys[slot], table.rows[slot] = key, (0 if same_row else table.size)
    table.size += 1
    return table.rows[slot]


def find_no_wrap(table, key):
    slot = table.home(key)
    while slot < table.num_slots:
        if table.keys[slot] is None:
            return -1
        if table.keys[slot] == key:
            return table.rows[slot]
        slot += 1
    return -1


def find_stops_at_other_key(table, key):
    slot = table.home(key)
    return table.rows[slot] if table.keys[slot] == key else -1


def test_linear_probing_passes(capsys):
    check_linear_probing(insert_right, find_right)
    assert "PASSED" in capsys.readouterr().out


def test_no_wrap_around_is_named():
    with pytest.raises(CheckFailed, match="wrap round"):
        check_linear_probing(lambda t, k: insert_right(t, k, wrap=False), find_no_wrap)


def test_find_stopping_at_another_key_is_named():
    with pytest.raises(CheckFailed, match="find stopped at slot 3"):
        check_linear_probing(insert_right, find_stops_at_other_key)


def test_insert_overwriting_another_key_is_named():
    with pytest.raises(CheckFailed, match="overwrote a slot"):
        check_linear_probing(lambda t, k: insert_right(t, k, overwrite=True), find_right)


def test_same_row_for_two_keys_is_named():
    with pytest.raises(CheckFailed, match="same row"):
        check_linear_probing(lambda t, k: insert_right(t, k, same_row=True), find_right)


def test_second_row_for_one_key_is_named():
    def insert_without_lookup(table, key):
        table.size += 1
        slot = table.home(key)
        while table.keys[slot] is not None:
            slot = (slot + 1) % table.num_slots
        table.keys[slot], table.rows[slot] = key, table.size - 1
        return table.size - 1

    with pytest.raises(CheckFailed, match="keeps its row"):
        check_linear_probing(insert_without_lookup, find_right)


def test_forgotten_load_bound_is_named():
    with pytest.raises(CheckFailed, match="raise HashTableFullError"):
        check_linear_probing(lambda t, k: insert_right(t, k, bound=False), find_right)


def test_linear_probing_stub_is_not_implemented():
    def stub(table, key):
        raise NotImplementedError("exercise: replace this line with your code")

    with pytest.raises(NotImplementedError):
        check_linear_probing(stub, stub)


# -- exercise 2: owners and split sizes -------------------------------------------------------


def owner_right(keys, world_size):
    return torch.remainder(keys, world_size)


def splits_right(keys_per_rank, rank, world_size):
    owners = [owner_right(k, world_size) for k in keys_per_rank]
    send = torch.bincount(owners[rank], minlength=world_size).tolist()
    recv = [int((owners[q] == rank).sum()) for q in range(world_size)]
    return send, recv


def test_owner_and_splits_pass(capsys):
    check_owner_and_splits(owner_right, splits_right)
    assert "PASSED" in capsys.readouterr().out


def test_negative_rank_is_named():
    with pytest.raises(CheckFailed, match="negative rank"):
        check_owner_and_splits(lambda k, n: torch.fmod(k, n), splits_right)


def test_swapped_splits_are_named():
    def swapped(keys_per_rank, rank, world_size):
        send, recv = splits_right(keys_per_rank, rank, world_size)
        return recv, send

    with pytest.raises(CheckFailed, match="swapped"):
        check_owner_and_splits(owner_right, swapped)


def test_recv_from_own_view_is_named():
    def own_view(keys_per_rank, rank, world_size):
        send, _ = splits_right(keys_per_rank, rank, world_size)
        return send, send

    with pytest.raises(CheckFailed, match="counted this rank's own keys"):
        check_owner_and_splits(owner_right, own_view)


def test_owner_and_splits_stub_is_not_implemented():
    def stub(*args):
        raise NotImplementedError("exercise: replace this line with your code")

    with pytest.raises(NotImplementedError):
        check_owner_and_splits(stub, stub)
