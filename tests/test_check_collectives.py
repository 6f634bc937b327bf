"""The lesson-00 checkers pass a right answer and name the mistake in wrong ones."""

import pytest
import torch
import torch.distributed as dist

from minidist import comm
from minidist.collectives import ring_all_reduce
from minidist.collectives.check import check_ring_all_gather, check_ring_all_reduce
from minidist.course.check import CheckFailed


def _ring_all_reduce(tensor, all_gather_phase=True, all_gather_offset=1):
    """A ring all-reduce with switchable mistakes (the correct one by default)."""
    n, rank = dist.get_world_size(), dist.get_rank()
    right, left = (rank + 1) % n, (rank - 1) % n
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

    for s in range(n - 1):
        step((rank - s) % n, (rank - s - 1) % n, add=True)
    if all_gather_phase:
        for s in range(n - 1):
            off = all_gather_offset
            step((rank + off - s) % n, (rank + off - 1 - s) % n, add=False)
    return padded[: tensor.numel()].clone()


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


def test_all_reduce_checker_passes_correct(capsys):
    check_ring_all_reduce(_ring_all_reduce)
    check_ring_all_reduce(ring_all_reduce)
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, hint",
    [
        (_forgot_all_gather, "Forgot the all-gather phase"),
        (lambda t: _ring_all_reduce(t, all_gather_offset=2), "off-by-one chunk index"),
        (_rotated, "rotated"),
        (_averaged, "divided by N"),
        (_uses_dist, "no send/recv"),
    ],
)
def test_all_reduce_checker_names_the_mistake(fn, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_ring_all_reduce(fn)


def test_all_gather_checker(capsys):
    check_ring_all_gather(_ring_all_gather)
    assert "PASSED" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="rotated|wrong order"):
        check_ring_all_gather(_all_gather_in_arrival_order)
    with pytest.raises(CheckFailed, match="left neighbour"):
        check_ring_all_gather(_all_gather_own_chunk)


def test_stub_surfaces_as_not_implemented():
    with pytest.raises(NotImplementedError):
        check_ring_all_reduce(_stub)
    with pytest.raises(NotImplementedError):
        check_ring_all_gather(_stub)
