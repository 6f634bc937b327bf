"""The lesson-00 checkers pass a right answer and name the mistake in wrong ones."""

import re
import time
from functools import partial

import pytest
import torch
import torch.distributed as dist

from minidist import comm
from minidist.collectives import ring_all_reduce
from minidist.collectives.check import check_ring_all_gather, check_ring_all_reduce
from minidist.course.check import CheckFailed, Mistake, catalogue_messages, names_mistake


def _ring_all_reduce(
    tensor,
    all_gather_phase=True,
    all_gather_offset=1,
    store_offset=0,
    steps_extra=(0, 0),
    recv_from_right=False,
):
    """A ring all-reduce with switchable mistakes (the correct one by default).

    `store_offset` shifts where the all-gather copies the incoming chunk; `steps_extra` adds
    steps to (reduce-scatter, all-gather).
    """
    n, rank = dist.get_world_size(), dist.get_rank()
    right, left = (rank + 1) % n, (rank + (1 if recv_from_right else -1)) % n
    padded = torch.zeros(-(-tensor.numel() // n) * n)
    padded[: tensor.numel()] = tensor
    chunks = padded.chunk(n)
    incoming = torch.empty_like(chunks[0])

    def step(send_idx, recv_idx, add):
        for w in comm.batch_isend_irecv(
            [("send", chunks[send_idx], right), ("recv", incoming, left)]
        ):
            w.wait()
        chunks[recv_idx].add_(incoming) if add else chunks[recv_idx].copy_(incoming)

    for s in range(n - 1 + steps_extra[0]):
        step((rank - s) % n, (rank - s - 1) % n, add=True)
    if all_gather_phase:
        for s in range(n - 1 + steps_extra[1]):
            off = all_gather_offset
            step((rank + off - s) % n, (rank + off - 1 - s - store_offset) % n, add=False)
    return padded[: tensor.numel()].clone()


def _no_padding(tensor):
    """Right sums, but chunks of unequal size (tensor_split), each received at its size."""
    n, rank = dist.get_world_size(), dist.get_rank()
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = tensor.clone().tensor_split(n)
    for add in (True, False):
        for s in range(n - 1):
            send_idx = (rank - s) % n if add else (rank + 1 - s) % n
            recv_idx = (send_idx - 1) % n
            incoming = torch.empty_like(chunks[recv_idx])
            for w in comm.batch_isend_irecv(
                [("send", chunks[send_idx], right), ("recv", incoming, left)]
            ):
                w.wait()
            chunks[recv_idx].add_(incoming) if add else chunks[recv_idx].copy_(incoming)
    return torch.cat(chunks)


def _wrong_peer(tensor):
    """Receives from the right neighbour instead of the left: right on 2 ranks, hangs on 4."""
    return _ring_all_reduce(tensor, recv_from_right=True)


def _forgot_all_gather(tensor):
    return _ring_all_reduce(tensor, all_gather_phase=False)


def _rotated(tensor):
    """Right sums, assembled one chunk off."""
    return _ring_all_reduce(tensor).roll(-(-tensor.numel() // dist.get_world_size()))


def _averaged(tensor):
    return ring_all_reduce(tensor) / dist.get_world_size()


def _uses_dist(tensor):
    dist.all_reduce(tensor)
    return tensor


def _stub(tensor):
    raise NotImplementedError("exercise: replace this line with your code")


def _ring_all_gather(chunk, arrival_order=False):
    n, rank = dist.get_world_size(), dist.get_rank()
    right, left = (rank + 1) % n, (rank - 1) % n
    out = torch.empty(n, chunk.numel())
    out[rank] = chunk
    for s in range(n - 1):
        send, recv = out[(rank - s) % n], torch.empty_like(chunk)
        for w in comm.batch_isend_irecv([("send", send.clone(), right), ("recv", recv, left)]):
            w.wait()
        out[(rank - s - 1) % n] = recv
    if arrival_order:  # own chunk first, then as they arrived: rank r-1, r-2, ...
        out = out[[(rank - b) % n for b in range(n)]]
    return out.reshape(-1)


def _all_gather_in_arrival_order(chunk):
    return _ring_all_gather(chunk, arrival_order=True)


def _all_gather_own_chunk(chunk):
    n, rank = dist.get_world_size(), dist.get_rank()
    out = torch.zeros(n, chunk.numel())
    out[rank] = chunk
    recv = torch.empty_like(chunk)
    for _ in range(n - 1):
        for w in comm.batch_isend_irecv(
            [("send", chunk, (rank + 1) % n), ("recv", recv, (rank - 1) % n)]
        ):
            w.wait()
        out[(rank - 1) % n] = recv
    return out.reshape(-1)


ALL_REDUCE_MISTAKES = [
    Mistake("right", (_ring_all_reduce,), ""),
    Mistake("library answer", (ring_all_reduce,), ""),
    Mistake("no all-gather phase", (_forgot_all_gather,), "Forgot the all-gather phase"),
    Mistake(
        "all-gather chunk off by one",
        (lambda t: _ring_all_reduce(t, all_gather_offset=2),),
        "off-by-one chunk index",
    ),
    Mistake("rotated", (_rotated,), "rotated"),
    Mistake("averaged", (_averaged,), "divided by N"),
    Mistake("through dist", (_uses_dist,), "no send/recv"),
    # copies the incoming chunk of all-gather step s into (r-s-1) instead of (r-s)
    Mistake(
        "stored one chunk off",
        (lambda t: _ring_all_reduce(t, store_offset=1),),
        r"at all-gather step 0 rank \d received chunk \d's complete sum and copied it into "
        r"chunk \d; it belongs in chunk \(r - s\) % N = \d",
    ),
    Mistake(
        "N steps in both phases",
        (lambda t: _ring_all_reduce(t, steps_extra=(1, 1)),),
        "both phases ran N = 2 steps",
    ),
    Mistake(
        "N steps in one phase",
        (lambda t: _ring_all_reduce(t, steps_extra=(0, 1)),),
        "one phase ran N = 2 steps",
    ),
    Mistake("no padding", (_no_padding,), r"sent chunks of \[2, 3\] elements.*pad with zeros to 9"),
]


@pytest.fixture(scope="module")
def all_reduce_messages():
    return catalogue_messages(check_ring_all_reduce, ALL_REDUCE_MISTAKES)


def test_all_reduce_checker_passes_correct(all_reduce_messages):
    assert all_reduce_messages["right"] is None and all_reduce_messages["library answer"] is None


@pytest.mark.parametrize("mistake", ALL_REDUCE_MISTAKES[2:], ids=lambda m: m.name)
def test_all_reduce_checker_names_the_mistake(mistake, all_reduce_messages):
    assert names_mistake(mistake, all_reduce_messages[mistake.name]) is None


@pytest.mark.parametrize("world, length", [(3, 9), (4, 10)])
def test_misplaced_all_gather_chunk_is_named_with_its_step(world, length):
    """On more than 2 ranks the mistake already shows in what is sent at the next step."""
    from minidist.collectives.check._shared import _all_reduce_input, _run_rank
    from minidist.collectives.check.all_reduce import _diagnose_sends
    from minidist.runtime import launch

    fn = partial(_ring_all_reduce, store_offset=1)
    results = launch(_run_rank, world, fn, _all_reduce_input, length)
    message = _diagnose_sends(world, length, [r[3] for r in results], [r[0] for r in results])
    assert re.search(
        r"at all-gather step 1 rank \d sent chunk \d, the right one, but it held the sum of "
        r"ranks .*at all-gather step 0 rank \d received chunk \d's complete sum and copied it "
        r"into chunk \d; it belongs in chunk \(r - s\) % N = \d",
        message,
    ), message


def test_wrong_peer_is_reported_quickly_as_a_ring_hang():
    t0 = time.monotonic()
    with pytest.raises(CheckFailed, match=r"still waiting after 3 s.*\(r \+ 1\) % N") as info:
        check_ring_all_reduce(_wrong_peer)
    assert time.monotonic() - t0 < 20
    assert "on a world of 4" in str(info.value)


def _all_gather_wrong_block(chunk):
    """Stores the chunk received at step s in block (r-s), its own block at step 0."""
    n, rank = dist.get_world_size(), dist.get_rank()
    right, left = (rank + 1) % n, (rank - 1) % n
    out = torch.zeros(n, chunk.numel())
    out[rank] = chunk
    for s in range(n - 1):
        send, recv = out[(rank - s) % n].clone(), torch.empty_like(chunk)
        for w in comm.batch_isend_irecv([("send", send, right), ("recv", recv, left)]):
            w.wait()
        out[(rank - s) % n] = recv
    return out.reshape(-1)


def _all_gather_extra_step(chunk):
    """N steps instead of N-1: the last one sends a chunk the neighbour already has."""
    n, rank = dist.get_world_size(), dist.get_rank()
    out = torch.empty(n, chunk.numel())
    out[rank] = chunk
    for s in range(n):
        send, recv = out[(rank - s) % n], torch.empty_like(chunk)
        for w in comm.batch_isend_irecv(
            [("send", send.clone(), (rank + 1) % n), ("recv", recv, (rank - 1) % n)]
        ):
            w.wait()
        out[(rank - s - 1) % n] = recv
    return out.reshape(-1)


def _all_gather_2d(chunk):
    return _ring_all_gather(chunk).reshape(dist.get_world_size(), -1)


def _all_gather_through_dist(chunk):
    out = torch.empty(dist.get_world_size() * chunk.numel())
    dist.all_gather_into_tensor(out, chunk)
    return out


def _all_gather_recv_from_right(chunk):
    n, rank = dist.get_world_size(), dist.get_rank()
    out = torch.empty(n, chunk.numel())
    out[rank] = chunk
    for s in range(n - 1):
        send, recv = out[(rank - s) % n].clone(), torch.empty_like(chunk)
        for w in comm.batch_isend_irecv(
            [("send", send, (rank + 1) % n), ("recv", recv, (rank + 1) % n)]
        ):
            w.wait()
        out[(rank - s - 1) % n] = recv
    return out.reshape(-1)


def _all_gather_no_modulo(chunk):
    n, rank = dist.get_world_size(), dist.get_rank()
    blocks = [None] * n
    blocks[rank] = chunk
    for s in range(n - 1):
        recv = torch.empty_like(chunk)
        sent = blocks[rank - s]  # negative indices wrap in Python: right by luck
        for w in comm.batch_isend_irecv(
            [("send", sent.clone(), rank + 1), ("recv", recv, (rank - 1) % n)]  # no % N
        ):
            w.wait()
        blocks[(rank - s - 1) % n] = recv
    return torch.cat(blocks)


def _all_gather_wrong_size(chunk):
    n, rank = dist.get_world_size(), dist.get_rank()
    out = torch.empty(n, chunk.numel())
    out[rank] = chunk
    for s in range(n - 1):
        send, recv = out[(rank - s) % n].clone(), torch.empty(max(1, chunk.numel() - 1))
        for w in comm.batch_isend_irecv(
            [("send", send, (rank + 1) % n), ("recv", recv, (rank - 1) % n)]
        ):
            w.wait()
        out[(rank - s - 1) % n, : recv.numel()] = recv
    return out.reshape(-1)


ALL_GATHER_MISTAKES = [
    Mistake("right", (_ring_all_gather,), ""),
    Mistake("arrival order", (_all_gather_in_arrival_order,), "rotated|wrong order"),
    Mistake("own chunk again", (_all_gather_own_chunk,), "left neighbour"),
    Mistake(
        "wrong block",
        (_all_gather_wrong_block,),
        r"at step 0 rank \d received rank \d's chunk; it belongs in block",
    ),
    Mistake("N steps", (_all_gather_extra_step,), "made 2 ring steps.*needs N-1 = 1"),
    Mistake("2-D result", (_all_gather_2d,), r"returned shape \(2, 3\).*one flat tensor"),
    Mistake("through dist", (_all_gather_through_dist,), "no send/recv"),
    Mistake(
        "receives from the right",
        (_all_gather_recv_from_right,),
        r"still waiting after .*\(r \+ 1\) % N",
        alone=True,
    ),
    Mistake(
        "peer without % N",
        (_all_gather_no_modulo,),
        r"rank 1: your code raised ValueError: batch_isend_irecv: peer=2 .*"
        r"_all_gather_no_modulo.*\(r \+ 1\) % N",
        alone=True,
    ),
    Mistake(
        "receive of another size",
        (_all_gather_wrong_size,),
        "a send and its receive had different sizes|receive of the same size",
        alone=True,
    ),
]


@pytest.fixture(scope="module")
def all_gather_messages():
    return catalogue_messages(check_ring_all_gather, ALL_GATHER_MISTAKES)


def test_all_gather_checker_passes(all_gather_messages):
    assert all_gather_messages["right"] is None


@pytest.mark.parametrize("mistake", ALL_GATHER_MISTAKES[1:], ids=lambda m: m.name)
def test_all_gather_checker_names_the_mistake(mistake, all_gather_messages):
    assert names_mistake(mistake, all_gather_messages[mistake.name]) is None


def test_stub_surfaces_as_not_implemented():
    with pytest.raises(NotImplementedError):
        check_ring_all_reduce(_stub)
    with pytest.raises(NotImplementedError):
        check_ring_all_gather(_stub)
