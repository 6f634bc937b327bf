"""The hash-embedding checkers pass right answers and name the mistake in wrong ones."""

import pytest
import torch

from minidist.course.check import CheckFailed
from minidist.embedding import HashTableFullError
from minidist.embedding.check import (
    check_dedup_backward,
    check_linear_probing,
    check_localized_reorder,
    check_owner_and_splits,
)

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


# -- exercise 3: the sort/dedup backward ------------------------------------------------------


def dedup_right(rows):
    order = torch.argsort(rows, stable=True)
    unique, counts = torch.unique_consecutive(rows[order], return_counts=True)
    return order, unique, torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])


def grads_right(rows, bags, grad_pooled, weights, loss_scale, *, assign=False, scale=True):
    order, unique, offsets = dedup_right(rows)
    run = torch.repeat_interleave(torch.arange(unique.numel()), offsets[1:] - offsets[:-1])
    contrib = weights[order, None] * grad_pooled[bags[order]]
    out = torch.zeros(unique.numel(), grad_pooled.shape[1])
    if assign:
        out[run] = contrib  # last write wins
    else:
        out.index_add_(0, run, contrib)
    return unique, out / loss_scale if scale else out


def test_dedup_backward_passes(capsys):
    check_dedup_backward(dedup_right, grads_right)
    out = capsys.readouterr().out
    assert "PASSED" in out and "run_offsets [0, 3, 5, 7, 8, 10], 5 unique rows" in out


def test_run_lengths_instead_of_offsets_are_named():
    def lengths(rows):
        order, unique, offsets = dedup_right(rows)
        return order, unique, offsets[1:] - offsets[:-1]

    with pytest.raises(CheckFailed, match="are the run lengths"):
        check_dedup_backward(lengths, grads_right)


def test_unstable_order_is_named():
    def unstable(rows):
        n = rows.numel()
        order = torch.argsort(rows * n + (n - 1 - torch.arange(n)))  # ties: last first
        _, unique, offsets = dedup_right(rows)
        return order, unique, offsets

    with pytest.raises(CheckFailed, match="not stable"):
        check_dedup_backward(unstable, grads_right)


def test_duplicates_not_summed_are_named():
    with pytest.raises(CheckFailed, match="only its last occurrence"):
        check_dedup_backward(dedup_right, lambda *a: grads_right(*a, assign=True))


def test_loss_scale_not_divided_is_named():
    with pytest.raises(CheckFailed, match="loss_scale = 8.0 times too large"):
        check_dedup_backward(dedup_right, lambda *a: grads_right(*a, scale=False))


def test_weights_left_out_are_named():
    def unweighted(rows, bags, grad_pooled, weights, loss_scale):
        return grads_right(rows, bags, grad_pooled, torch.ones_like(weights), loss_scale)

    with pytest.raises(CheckFailed, match="weights are missing"):
        check_dedup_backward(dedup_right, unweighted)


def test_dedup_backward_stub_is_not_implemented():
    def stub(*args):
        raise NotImplementedError("exercise: replace this line with your code")

    with pytest.raises(NotImplementedError):
        check_dedup_backward(stub, stub)


# -- exercise 4: the localized reorder --------------------------------------------------------


def reorder_right(received, batch, slots, world_size):
    bag_owner = (torch.arange(batch * slots) % slots) % world_size
    order = torch.argsort(bag_owner, stable=True)  # bag order[j] arrived j-th
    out = torch.empty_like(received)
    out[order] = received
    return out


def test_localized_reorder_passes(capsys):
    check_localized_reorder(reorder_right)
    assert "PASSED" in capsys.readouterr().out


def test_order_as_received_is_named():
    with pytest.raises(CheckFailed, match="in the order they arrived"):
        check_localized_reorder(lambda r, b, s, n: r.clone())


def test_slot_major_owner_chunks_are_named():
    def slot_major(received, batch, slots, world_size):
        bag = torch.arange(batch * slots)
        key = (bag % slots % world_size) * batch * slots + (bag % slots) * batch + bag // slots
        out = torch.empty_like(received)
        out[torch.argsort(key)] = received
        return out

    with pytest.raises(CheckFailed, match="not slot-major"):
        check_localized_reorder(slot_major)


def test_block_placement_is_named():
    def blocks(received, batch, slots, world_size):
        per = -(-slots // world_size)
        bag_owner = (torch.arange(batch * slots) % slots) // per
        out = torch.empty_like(received)
        out[torch.argsort(bag_owner, stable=True)] = received
        return out

    with pytest.raises(CheckFailed, match="not in blocks"):
        check_localized_reorder(blocks)


def test_equal_owner_chunks_are_named():
    def equal_chunks(received, batch, slots, world_size):
        per = slots // world_size  # wrong when N does not divide the slots
        out = torch.empty_like(received)
        for j in range(received.shape[0]):
            q, within = divmod(j, max(1, batch * per))
            i, k = divmod(within, max(1, per))
            out[min(i * slots + q + k * world_size, out.shape[0] - 1)] = received[j]
        return out

    with pytest.raises(CheckFailed, match="hold different numbers"):
        check_localized_reorder(equal_chunks)


def test_localized_reorder_stub_is_not_implemented():
    def stub(*args):
        raise NotImplementedError("exercise: replace this line with your code")

    with pytest.raises(NotImplementedError):
        check_localized_reorder(stub)


# -- exercise 1's catalogue: one wrong answer per likely mistake ------------------------------


def probe_insert(
    table,
    key,
    *,
    step=1,
    modulus=None,
    home=None,
    over=False,
    changes_first=False,
    bound_first=False,
    row_is_slot=False,
):
    """insert with one mistake switched on."""
    n = table.num_slots
    if bound_first and table.size + 1 > table.capacity:
        raise HashTableFullError("full")
    row = find_right(table, key)
    if row >= 0:
        return row
    if changes_first:
        table.size += 1
    if (
        (table.size + 1 >= table.capacity)
        if over
        else (table.size + 1 > table.capacity + changes_first)
    ):
        raise HashTableFullError(f"capacity {table.capacity}")
    slot = home(key, n) if home else table.home(key)
    while table.keys[slot] is not None:
        slot = (slot + step) % (modulus or n)
    table.keys[slot] = key
    table.rows[slot] = slot if row_is_slot else table.size - changes_first
    table.size += 1 - changes_first
    return table.rows[slot]


def probe_find(
    table,
    key,
    *,
    step=1,
    modulus=None,
    home=None,
    missing=-1,
    slot_not_row=False,
    no_empty_stop=False,
):
    n = table.num_slots
    slot = home(key, n) if home else table.home(key)
    for _ in range(n):
        if table.keys[slot] is None and not no_empty_stop:
            return missing
        if table.keys[slot] == key:
            return slot if slot_not_row else table.rows[slot]
        slot = (slot + step) % (modulus or n)
    while no_empty_stop:  # scans on until it meets the key
        slot = (slot + step) % n
        if table.keys[slot] == key:
            return table.rows[slot]
    return missing


def both(**switches):
    ins = {
        k: v
        for k, v in switches.items()
        if k in ("step", "modulus", "home", "over", "changes_first", "bound_first", "row_is_slot")
    }
    fnd = {
        k: v
        for k, v in switches.items()
        if k in ("step", "modulus", "home", "missing", "slot_not_row", "no_empty_stop")
    }
    return (lambda t, k: probe_insert(t, k, **ins), lambda t, k: probe_find(t, k, **fnd))


PROBING_MISTAKES = [
    (*both(), None),
    ((lambda t, k: insert_right(t, k, wrap=False)), find_no_wrap, "wrap round"),
    (insert_right, find_stops_at_other_key, "find stopped at slot 3"),
    ((lambda t, k: insert_right(t, k, overwrite=True)), find_right, "overwrote a slot"),
    ((lambda t, k: insert_right(t, k, same_row=True)), find_right, "same row"),
    ((lambda t, k: insert_right(t, k, bound=False)), find_right, "raise HashTableFullError"),
    (*both(modulus=7), "wraps at num_slots - 1"),
    (*both(step=2), "moves 2 slots at a time"),
    (*both(step=-1), "moves backwards"),
    (*both(modulus=9), "raised IndexError.*at line.*wrap round"),
    (*both(home=lambda k, n: k & n), "key & num_slots"),
    (*both(over=True), "HashTableFullError.*off by one"),
    (*both(row_is_slot=True), "their slots"),
    (*both(slot_not_row=True), "find returned 1, 2, 4, their slots"),
    (*both(bound_first=True), "already in it"),
    (*both(changes_first=True), "changed the table first"),
    (*both(missing=None), "returned None for a key never inserted"),
    (*both(no_empty_stop=True), "still running after 2 s.*never meets an empty slot"),
    ((lambda key, table: insert_right(table, key)), find_right, "AttributeError.*table first"),
]


@pytest.mark.parametrize("insert, find, words", PROBING_MISTAKES)
def test_linear_probing_catalogue(insert, find, words):
    if words is None:  # the switches' default is the right answer
        check_linear_probing(insert, find)
        return
    with pytest.raises(CheckFailed, match=words):
        check_linear_probing(insert, find)


def test_linear_probing_catalogue_is_large_enough():
    assert len(PROBING_MISTAKES) - 1 >= 8


# -- exercise 2's catalogue -------------------------------------------------------------------


def splits_with(owner=owner_right, minlength=True, distinct=False, recv="right"):
    def split_sizes(keys_per_rank, rank, world_size):
        keys = [k.unique() if distinct else k for k in keys_per_rank]
        owners = [owner(k, world_size) for k in keys]
        extra = dict(minlength=world_size) if minlength else {}
        send = torch.bincount(owners[rank], **extra).tolist()
        got = {
            "right": [int((owners[q] == rank).sum()) for q in range(world_size)],
            "own": send,
            "total": [int(sum((o == q).sum() for o in owners)) for q in range(world_size)],
        }[recv]
        return send, got

    return split_sizes


OWNER_SPLIT_MISTAKES = [
    (lambda k, n: torch.fmod(k, n), splits_right, "negative rank"),
    (lambda k, n: k.abs() % n, splits_right, r"abs\(key\) mod N"),
    (lambda k, n: k & (n - 1), splits_right, "only when N is a power"),
    (lambda k, n: torch.remainder(k.int(), n), splits_right, "int32"),
    (lambda k, n: torch.remainder(k, n).float(), splits_right, "ranks are integers"),
    (lambda k, n: torch.remainder(k, n).tolist(), splits_right, "returned a list"),
    (owner_right, splits_with(minlength=False), "fewer than N = 4 entries.*minlength"),
    (owner_right, splits_with(owner=lambda k, n: torch.fmod(k, n)), "bincount of negative owners"),
    (owner_right, splits_with(distinct=True), "counted distinct keys"),
    (owner_right, lambda *a: splits_right(*a)[::-1], "swapped"),
    (owner_right, splits_with(recv="own"), "counted this rank's own keys"),
    (owner_right, splits_with(recv="total"), "all the keys q owns"),
    (owner_right, lambda k, r, n: (splits_right(k, r, n)[0], [0] * n), "recv.*expected"),
    (owner_right, lambda k, r, n: 7, "return \\(send, recv\\)"),
    (owner_right, lambda k, n: 0, "TypeError.*keys_per_rank"),
    # found by a learner who had not seen this catalogue
    (lambda k, n: torch.remainder(k, n).to(torch.int32), splits_right, "int64 ranks"),
    (owner_right, lambda *a: tuple(torch.tensor(p) for p in splits_right(*a)), "lists of Python"),
]


@pytest.mark.parametrize("owner, split_sizes, words", OWNER_SPLIT_MISTAKES)
def test_owner_and_splits_catalogue(owner, split_sizes, words):
    with pytest.raises(CheckFailed, match=words):
        check_owner_and_splits(owner, split_sizes)


def test_owner_and_splits_catalogue_is_large_enough():
    assert len(OWNER_SPLIT_MISTAKES) >= 8


# -- exercise 3's catalogue -------------------------------------------------------------------


def dedup_with(stable=True, unique="right", order="right"):
    def sort_and_dedup(rows):
        o, u, offsets = dedup_right(rows)
        if not stable:
            o = torch.argsort(rows)  # the default sort: ties in any order
        if unique == "sorted":
            u = torch.sort(rows).values
        elif unique == "descending":
            u = u.flip(0)
        if order == "values":
            o = torch.sort(rows).values
        return o, u, offsets

    return sort_and_dedup


def grads_weighted(power=1, mean=False, occurrence=False):
    def row_gradients(rows, bags, grad_pooled, weights, loss_scale):
        unique, out = grads_right(rows, bags, grad_pooled, weights**power, loss_scale)
        if mean:
            out = out / torch.bincount(torch.searchsorted(unique, rows)).float()[:, None]
        if occurrence:
            return unique, weights[:, None] * grad_pooled[bags] / loss_scale
        return unique, out

    return row_gradients


DEDUP_MISTAKES = [
    (dedup_with(stable=False), grads_right, "not stable"),
    (dedup_with(unique="sorted"), grads_right, "sorted but not deduplicated"),
    (dedup_with(unique="descending"), grads_right, "is descending"),
    (dedup_with(order="values"), grads_right, "holds the sorted rows"),
    (
        lambda r: (*dedup_right(r)[:2], (lambda o: o[1:] - o[:-1])(dedup_right(r)[2])),
        grads_right,
        "are the run lengths",
    ),
    (lambda r: (*dedup_right(r)[:2], dedup_right(r)[2][1:]), grads_right, "U \\+ 1"),
    (lambda r: (*dedup_right(r)[:2], dedup_right(r)[2][:-1]), grads_right, "U \\+ 1"),
    (dedup_right, lambda *a: grads_right(*a, assign=True), "only its last occurrence"),
    (dedup_right, lambda *a: grads_right(*a, scale=False), "loss_scale = 8.0 times too large"),
    (dedup_right, lambda r, b, g, w, s: grads_right(r, b, g, w, 1 / s), "multiplied by"),
    (dedup_right, grads_weighted(power=0), "weights are missing"),
    (dedup_right, grads_weighted(power=2), "applied twice"),
    (dedup_right, grads_weighted(mean=True), "you averaged"),
    (dedup_right, grads_weighted(occurrence=True), "one gradient per occurrence"),
    (dedup_right, lambda *a: (lambda u, g: (u, g / 10))(*grads_right(*a)), "0.1 times the dense"),
    (
        dedup_right,
        lambda r, b, g, w, s: grads_right(r, torch.arange(r.numel()), g, w, s),
        "IndexError.*bags\\[i\\]",
    ),
    (dedup_right, lambda r, b, g, w, s: (r, g), "unique_rows .* expected"),
    (lambda rows: rows.sort(), grads_right, "return a tuple"),
]


@pytest.mark.parametrize("sort_and_dedup, row_gradients, words", DEDUP_MISTAKES)
def test_dedup_backward_catalogue(sort_and_dedup, row_gradients, words):
    with pytest.raises(CheckFailed, match=words):
        check_dedup_backward(sort_and_dedup, row_gradients)


def test_dedup_backward_catalogue_is_large_enough():
    assert len(DEDUP_MISTAKES) >= 8


# -- exercise 4's catalogue -------------------------------------------------------------------


def reorder_reshape(received, batch, slots, world_size):
    per = slots // world_size  # assumes N divides the slots
    chunks = received.reshape(world_size, batch, per, -1)  # owner, sample, slot of the owner
    return chunks.permute(1, 2, 0, 3).reshape(batch * slots, -1)


def reorder_with(stable=True, gather=False, bag_mod=False, slot_major=False):
    def reorder(received, batch, slots, world_size):
        bag = torch.arange(batch * slots)
        owner = bag % world_size if bag_mod else (bag % slots) % world_size
        order = torch.argsort(owner, stable=stable) if stable else torch.argsort(owner)
        if gather:
            return received[order]
        out = torch.empty_like(received)
        out[order] = received
        if slot_major:
            return out.reshape(batch, slots, -1).transpose(0, 1).reshape(batch * slots, -1)
        return out

    return reorder


REORDER_MISTAKES = [
    (lambda r, b, s, n: r.clone(), "in the order they arrived"),
    (reorder_with(stable=False), "stable=True"),
    (reorder_with(gather=True), "you gathered"),
    (reorder_with(bag_mod=True), "not b mod N"),
    (reorder_with(slot_major=True), "your result is slot-major"),
    (reorder_reshape, "raised RuntimeError.*reshape that assumes"),
    (lambda r, b, s, n: r.reshape(b, s, -1), r"returned \(3, 4, 2\)"),
    (lambda r, b, s, n: r[: b * s - 1], "expected a tensor"),
    (lambda r, b, s, n: r[torch.arange(b * s) + 1], "IndexError.*i·slots"),
]


@pytest.mark.parametrize("reorder, words", REORDER_MISTAKES)
def test_localized_reorder_catalogue(reorder, words):
    with pytest.raises(CheckFailed, match=words):
        check_localized_reorder(reorder)


def test_localized_reorder_catalogue_is_large_enough():
    # with the slot-major owner chunks, block placement and equal chunks tested above: 12
    assert len(REORDER_MISTAKES) + 3 >= 8
