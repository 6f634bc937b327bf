"""The ledger records every collective with the NCCL-tests ring factors; ring all-reduce works."""

import time

import pytest
import torch
import torch.distributed as dist

import minidist
from minidist import comm
from minidist.collectives import ring_all_reduce

S = 48  # elements: divisible by 2, 3 and 4
F32 = 4


def every_collective():
    rank, n = dist.get_rank(), dist.get_world_size()
    full = torch.full((S,), float(rank + 1))
    chunk = torch.empty(S // n)
    with comm.record() as ledger:
        comm.all_reduce(full.clone())
        comm.reduce_scatter(chunk, full.clone())
        comm.all_gather(torch.empty(S), chunk)
        comm.all_gather([torch.empty(S // n) for _ in range(n)], chunk)  # torch's list form
        comm.broadcast(full.clone(), src=0)
        comm.reduce(full.clone(), dst=0)
        comm.all_to_all(torch.empty(S), full.clone())
        peer = (rank + 1) % n, (rank - 1) % n
        for w in comm.batch_isend_irecv(
            [("send", full, peer[0]), ("recv", torch.empty(S), peer[1])]
        ):
            w.wait()
    return [(r.op, r.group_size, r.payload_bytes, r.ring_bytes) for r in ledger.records]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ledger_bytes_match_ring_theory(n):
    b = S * F32
    expected = [
        ("all_reduce", n, b, 2 * (n - 1) / n * b),
        ("reduce_scatter", n, b, (n - 1) / n * b),
        ("all_gather", n, b, (n - 1) / n * b),
        ("all_gather", n, b, (n - 1) / n * b),
        ("broadcast", n, b, b),
        ("reduce", n, b, b),
        ("all_to_all", n, b, (n - 1) / n * b),
        ("send", n, b, b),
        ("recv", n, b, 0),
    ]
    for records in minidist.launch(every_collective, n):
        assert [(op, g, p) for op, g, p, _ in records] == [(op, g, p) for op, g, p, _ in expected]
        assert [r for *_, r in records] == pytest.approx([r for *_, r in expected])


def collectives_are_real():
    """The wrappers must compute what torch.distributed computes."""
    rank, n = dist.get_rank(), dist.get_world_size()
    x = torch.arange(8.0) + rank
    summed = x.clone()
    comm.all_reduce(summed)
    mine = torch.empty(8 // n)
    comm.reduce_scatter(mine, x.clone())
    gathered = torch.empty(8 * n)
    comm.all_gather(gathered, x)
    listed = [torch.empty(8) for _ in range(n)]
    comm.all_gather(listed, x)  # torch.distributed's list form
    assert torch.equal(torch.cat(listed), gathered)
    swapped = torch.empty(8)
    comm.all_to_all(swapped, x)
    return summed, mine, gathered, swapped


def test_wrappers_compute_the_collective():
    results = minidist.launch(collectives_are_real, 2)
    total = torch.arange(8.0) * 2 + 1
    for rank, (summed, mine, gathered, swapped) in enumerate(results):
        assert torch.equal(summed, total)
        assert torch.equal(mine, total[rank * 4 : (rank + 1) * 4])
        assert torch.equal(gathered, torch.cat([torch.arange(8.0), torch.arange(8.0) + 1]))
        assert torch.equal(
            swapped, torch.cat([(torch.arange(8.0) + r)[rank * 4 : rank * 4 + 4] for r in range(2)])
        )


def subgroup_ledger():
    rank = dist.get_rank()
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = groups[rank // 2]
    t = torch.ones(10)
    with comm.record() as ledger:
        comm.all_reduce(t, group=mine)
    r = ledger.records[0]
    return r.group_size, r.group_ranks, r.ring_bytes, t[0].item()


def test_subgroups_are_recorded_with_their_ranks():
    results = minidist.launch(subgroup_ledger, 4)
    assert results[0] == (2, (0, 1), 40.0, 2.0)
    assert results[3] == (2, (2, 3), 40.0, 2.0)


def ledger_outside_record():
    comm.all_reduce(torch.ones(4))  # not recorded: no open ledger
    with comm.record() as outer:
        comm.all_reduce(torch.ones(4))
        with comm.record() as inner:
            comm.all_reduce(torch.ones(4), async_op=True).wait()
    return len(outer.records), len(inner.records), inner.records[0].end is not None, outer.table()


def test_nested_ledgers_and_async_end_times():
    n_outer, n_inner, has_end, table = minidist.launch(ledger_outside_record, 2)[0]
    assert (n_outer, n_inner, has_end) == (2, 1, True)
    assert "all_reduce" in table and "total" in table


def async_end_after_return():
    """Rank 1's async all-reduce cannot finish before rank 0 joins it, 0.3 s later."""
    t = torch.ones(4)
    comm.barrier()
    if dist.get_rank() == 0:
        time.sleep(0.3)
        comm.all_reduce(t)
        return None
    with comm.record() as ledger:
        work = comm.all_reduce(t, async_op=True)
        returned = time.perf_counter()
        work.wait()
    rec = ledger.records[0]
    deadline = time.perf_counter() + 2.0
    while rec.end is None and time.perf_counter() < deadline:  # a future callback sets it
        time.sleep(0.005)
    return rec.start, returned, rec.end, t.tolist()


def test_async_end_time_is_when_the_op_completed():
    start, returned, end, summed = minidist.launch(async_end_after_return, 2, timeout_s=30)[1]
    assert summed == [2.0] * 4
    assert end is not None
    # the op was still waiting for rank 0 when the call returned: it ended after that
    assert start <= returned <= end


def uneven_all_to_all(row: int):
    """Rank s sends split(s, d) rows to rank d: every rank sends a different amount to each."""
    rank, n = dist.get_rank(), dist.get_world_size()

    def split(src, dst):
        return 1 + src + 2 * dst

    def chunk(src, dst):  # values name the sender and the receiver
        values = 1000 * src + 100 * dst + torch.arange(split(src, dst) * row, dtype=torch.float32)
        return values.reshape(-1, row) if row > 1 else values

    inp = torch.cat([chunk(rank, d) for d in range(n)])
    out = torch.empty_like(torch.cat([chunk(s, rank) for s in range(n)]))
    with comm.record() as ledger:
        comm.all_to_all(
            out,
            inp,
            output_split_sizes=[split(s, rank) for s in range(n)],
            input_split_sizes=[split(rank, d) for d in range(n)],
        )
    expected = torch.cat([chunk(s, rank) for s in range(n)])
    (r,) = ledger.records
    own = split(rank, rank) * row * F32  # the chunk a rank keeps is not sent
    return torch.equal(out, expected), r.payload_bytes, r.ring_bytes, inp.numel() * F32, own


@pytest.mark.parametrize("row", [1, 3])  # 1-D input, and rows of 3 elements
def test_all_to_all_uneven_splits(row):
    for rank, (landed, payload, sent, in_bytes, own) in enumerate(
        minidist.launch(uneven_all_to_all, 3, row)
    ):
        assert landed, f"rank {rank}"
        assert payload == in_bytes
        assert sent == in_bytes - own, f"rank {rank}: sends all its input but its own chunk"


def ring_vs_dist(numel, integer):
    g = torch.Generator().manual_seed(dist.get_rank())
    x = (
        torch.randint(-50, 50, (numel,), generator=g).float()
        if integer
        else torch.randn(numel, generator=g)
    )
    x = x.reshape(-1, 1) if numel % 2 == 0 else x
    expected = x.clone()
    dist.all_reduce(expected)
    with comm.record() as ledger:
        ring_all_reduce(x)
    return x, expected, ledger.total_ring_bytes("send")


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("numel", [1, 7, 64])
def test_ring_all_reduce_equals_dist_all_reduce(n, numel):
    for x, expected, _ in minidist.launch(ring_vs_dist, n, numel, True):
        assert torch.equal(x, expected)  # integers: exact whatever the summation order
    for x, expected, sent in minidist.launch(ring_vs_dist, n, numel, False):
        assert torch.allclose(x, expected, atol=1e-6)
        padded = -(-numel // n) * n
        assert sent == 2 * (n - 1) / n * padded * F32


def test_ring_bytes_of_a_group_of_one_is_zero():
    assert comm.ring_bytes("all_reduce", 100, 1) == 0
    assert comm.ring_bytes("send", 100, 1) == 100


def _bad_peer():
    with comm.record() as ledger:
        with pytest.raises(ValueError, match=r"peer=2 of a send is not in \(0, 1\)"):
            comm.batch_isend_irecv([("recv", torch.empty(1), 1), ("send", torch.ones(1), 2)])
    return ledger.ops()


def test_p2p_peer_outside_the_group_is_refused_before_anything_is_posted():
    assert minidist.launch(_bad_peer, 2) == [[], []]


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_a_tensor_the_backend_cannot_move_is_refused_by_comm(monkeypatch, backend):
    """A fake group on CPUs: the refusal comes before the backend (or the ledger) is reached."""
    monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)
    monkeypatch.setattr(dist, "all_reduce", lambda *a, **k: pytest.fail("reached the backend"))
    monkeypatch.setattr(comm, "_group_ranks", lambda group: (0, 1))
    wrong = torch.ones(3) if backend == "nccl" else torch.ones(3, device="meta")
    rule = "NCCL moves only CUDA tensors" if backend == "nccl" else "gloo moves CPU tensors"
    with comm.record() as ledger:
        message = f"the tensor tagged 'grads' is on {wrong.device}, which backend '{backend}'"
        with pytest.raises(ValueError, match=f"comm.all_reduce: {message} cannot move: {rule}"):
            comm.all_reduce(wrong, tag="grads")
        with pytest.raises(
            ValueError, match=r"comm.reduce_scatter: the tensor tagged '\(untagged\)'"
        ):
            comm.reduce_scatter(torch.empty(1, device="meta"), torch.empty(2, device="meta"))
        with pytest.raises(ValueError, match=r"comm.batch_isend_irecv \(send\)"):
            comm.batch_isend_irecv([("send", wrong, 1)])
    assert ledger.records == []
    expected = "cpu" if backend == "gloo" else None
    if expected:
        assert comm.group_device() == torch.device(expected)


def _aliasing():
    """In place is accepted (and right); any other overlap is refused on every rank before
    anything is sent (each refused call overlaps on every rank, so none waits for a peer)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    k = S // n
    mine, other = slice(rank * k, (rank + 1) * k), (rank + 1) % n
    want = torch.cat([torch.full((k,), float(r + 1)) for r in range(n)])
    full = torch.full((S,), float(rank + 1))
    comm.all_gather(full, full[mine])  # NCCL's in-place all-gather
    listed = list(torch.full((S,), float(rank + 1)).chunk(n))
    comm.all_gather(listed, listed[rank])  # the list form, in place
    grads = torch.full((S,), float(rank + 1))
    comm.reduce_scatter(grads[mine], grads)  # NCCL's in-place reduce-scatter
    right = (
        torch.equal(full, want)
        and torch.equal(torch.cat(listed), want)
        and torch.equal(grads[mine], torch.full((k,), float(n * (n + 1) // 2)))
    )
    refused = []
    shifted = slice(rank * k + 1, (rank + 1) * k + 1) if rank < n - 1 else slice(S - k - 1, S - 1)
    calls = [
        lambda: comm.all_gather(full, full[other * k : (other + 1) * k].detach()),
        lambda: comm.all_gather(full, full[shifted]),
        lambda: comm.all_gather(listed, listed[other]),
        lambda: comm.reduce_scatter(grads[other * k : (other + 1) * k], grads, tag="grads"),
        lambda: comm.all_to_all(full, full),
    ]
    with comm.record() as ledger:
        for call in calls:
            try:
                call()
            except ValueError as exc:
                refused.append(str(exc))
    return right, refused, ledger.ops()


def test_an_input_aliasing_the_output_is_refused_unless_in_place():
    for right, refused, ops in minidist.launch(_aliasing, 3):
        assert right and ops == []
        assert len(refused) == 5
        assert all("shares memory with" in m for m in refused)
        assert "the input shares memory with the output but is not this rank's own" in refused[0]
        assert "the input overlaps chunk" in refused[1] and "(in place)" in refused[2]
        assert "comm.reduce_scatter (tag 'grads'): the output shares memory" in refused[3]
        assert "an all-to-all has no in-place form" in refused[4]


def _groups_made_once(store_path):
    rank, n = dist.get_rank(), dist.get_world_size()
    first = [comm.new_group([r], "a") for r in range(n)]  # every rank makes every group
    again = [comm.new_group([r], "a") for r in range(n)]
    other = [comm.new_group([r], "b") for r in range(n)]
    pair = comm.new_group(range(n), "pair")
    same = (first[rank] is again[rank], first[rank] is not other[rank])
    t = torch.ones(1)
    comm.all_reduce(t, group=pair)
    # a new world in this process (as after a restart): the old world's groups are gone
    dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.FileStore(store_path, n), rank=rank, world_size=n)
    fresh = comm.new_group(range(n), "pair")
    u = torch.ones(1)
    comm.all_reduce(u, group=fresh)
    return same, float(t[0]), float(u[0]), fresh is not pair


def test_new_group_makes_a_group_once_per_world_and_purpose(tmp_path):
    """The same (purpose, ranks) gives the first call's group; another purpose or another
    world, a group of its own (the old world's would fail at its first collective)."""
    got = minidist.launch(_groups_made_once, 2, str(tmp_path / "store2"), timeout_s=120)
    assert got == [((True, True), 2.0, 2.0, True)] * 2


def nested_ledgers():
    t = torch.ones(4)
    with comm.record() as outer:
        with comm.record() as inner:  # both see the same calls: equal as dataclasses
            comm.all_reduce(t)
        comm.all_reduce(t)
    with comm.record() as after:
        comm.all_reduce(t)
    return len(outer.records), len(inner.records), len(after.records), len(comm._active_ledgers)


def test_a_ledger_inside_another_with_the_same_calls_closes_itself_not_the_outer_one():
    """Closing the inner ledger took the first equal one off the list (the outer), and the
    outer one's close then failed: lesson 17's run_rank records each step inside a test's own
    record()."""
    assert minidist.launch(nested_ledgers, 2) == [(2, 1, 1, 0)] * 2
