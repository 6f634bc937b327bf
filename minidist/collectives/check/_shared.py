"""Helpers the collectives checkers share."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from ... import comm
from ...course.check import fail, run_on_world
from ...runtime import RankFailedError

ALL_REDUCE_CASES = [(2, 8), (4, 8), (3, 9), (3, 7), (4, 10)]  # (world, length)
ALL_GATHER_CASES = [(2, 3), (4, 2), (3, 5), (4, 1)]  # (world, chunk length)
RING_HANG_HINT = (
    "In a ring, rank r sends to rank (r + 1) % N and receives from rank (r - 1) % N, and "
    "every send must pair with a receive of the same size on its peer in the same step: "
    "post both with one comm.batch_isend_irecv, with the right peers, and wait on both."
)
RING_HINTS = {
    r"^IndexError|out of range": "a chunk or peer index past the end: indices on a ring wrap "
    "around, (r + 1) % N and (r - s) % N, and range(N - 1) stops at step N-2",
    r"Invalid (destination|source) rank|peer=-?\d+ of a": "a peer rank "
    "outside 0..N-1: the right neighbour is (r + 1) % N, the left one (r - 1) % N",
}
RS, AG = "reduce-scatter", "all-gather"
RULES = {
    RS: "at reduce-scatter step s rank r sends chunk (r - s) % N and adds the incoming one "
    "into chunk (r - s - 1) % N",
    AG: "at all-gather step s rank r sends chunk (r + 1 - s) % N and copies the incoming one "
    "into chunk (r - s) % N",
}


def _all_reduce_input(rank: int, n: int, length: int) -> torch.Tensor:
    return 2.0**rank + 2.0**n * torch.arange(length, dtype=torch.float32, device="cpu")


def _all_gather_input(rank: int, n: int, length: int) -> torch.Tensor:
    return 100.0 * rank + torch.arange(length, dtype=torch.float32, device="cpu")


def _run_rank(fn: Callable, make_input: Callable, length: int):
    """On a rank: call the learner's function on this rank's input, with the ledger on."""
    rank, n = dist.get_rank(), dist.get_world_size()
    x = make_input(rank, n, length)
    with comm.record(keep_sent=True) as ledger:
        out = fn(x)
    out = out.detach().clone() if isinstance(out, torch.Tensor) else out
    sent = [r.sent.reshape(-1) for r in ledger.records if r.op == "send"]
    return out, ledger.ops(), ledger.total_ring_bytes("send"), sent


def _run(name: str, n: int, fn: Callable, make_input: Callable, length: int) -> list:
    try:
        return run_on_world(
            _run_rank, n, fn, make_input, length, hang_hint=RING_HANG_HINT, hints=RING_HINTS
        )
    except RankFailedError as exc:
        if exc.rank is not None and "size" in str(exc).lower() and "match" in str(exc).lower():
            fail(
                f"{name} on {n} ranks: a send and its receive had different sizes, and the "
                "backend aborted. Every step of a ring moves one chunk of the same size: pad "
                "the tensor to a multiple of N and cut it into N equal chunks; receive into a "
                "buffer of that size."
            )
        raise


def _check_ledger(name: str, n: int, ops: list[list[str]], sent: list[float], ring: float):
    if not any(ops):
        fail(
            f"{name}: the answer is right but no send/recv went through minidist.comm. "
            "Build it from comm.batch_isend_irecv (or comm.send / comm.recv), not from dist."
        )
    other = sorted({op for rank_ops in ops for op in rank_ops} - {"send", "recv"})
    if other:
        fail(f"{name}: use only send/recv; the ledger shows {other}.")
    for rank, s in enumerate(sent):
        if s != ring:
            more = "more" if s > ring else "less"
            fail(
                f"{name} on {n} ranks: rank {rank} sent {s:.0f} bytes, {more} than the ring's "
                f"{ring:.0f}. A ring step sends one chunk of S/N bytes to the right neighbour."
            )
