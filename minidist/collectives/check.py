"""Checkers for lesson 00: a ring all-reduce and a ring all-gather built from send/recv.

Each checker runs the learner's function on worlds of 2, 3 and 4 ranks (odd sizes, lengths
that do not divide by N) and compares with the collective it imitates. Inputs are chosen so
that every output value says where it came from, and a wrong answer is explained:

- all-reduce input on rank r, element i: 2^r + 2^N·i. A sum over a set of ranks S keeps S in
  its low N bits and the element index above them, so a wrong element decodes into "sum of
  ranks S of element i": missing ranks mean a phase or a step is missing, a wrong i means
  the right sum sits at the wrong place (an off-by-one or rotated chunk index).
- all-gather input on rank r, element i: 100·r + i, so each output block names its source.

Then the ledger must show only send/recv, and each rank must send what the ring sends:
2(N-1)/N·S for the all-reduce, (N-1)/N·S for the all-gather (Patarasuk & Yuan 2009).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from .. import comm
from ..course.check import fail, passed, run_on_world
from . import theory

ALL_REDUCE_CASES = [(2, 8), (4, 8), (3, 9), (3, 7), (4, 10)]  # (world, length)
ALL_GATHER_CASES = [(2, 3), (4, 2), (3, 5), (4, 1)]  # (world, chunk length)


def _all_reduce_input(rank: int, n: int, length: int) -> torch.Tensor:
    return 2.0**rank + 2.0**n * torch.arange(length, dtype=torch.float32)


def _all_gather_input(rank: int, n: int, length: int) -> torch.Tensor:
    return 100.0 * rank + torch.arange(length, dtype=torch.float32)


def _run_rank(fn: Callable, make_input: Callable, length: int):
    """On a rank: call the learner's function on this rank's input, with the ledger on."""
    rank, n = dist.get_rank(), dist.get_world_size()
    x = make_input(rank, n, length)
    with comm.record() as ledger:
        out = fn(x)
    out = out.detach().clone() if isinstance(out, torch.Tensor) else out
    sent = ledger.total_ring_bytes("send")
    return out, ledger.ops(), sent


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


def check_ring_all_reduce(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Check `fn(tensor) -> tensor`: the sum of `tensor` over all ranks, built on a ring."""
    even_passed = False
    for n, length in ALL_REDUCE_CASES:
        results = run_on_world(_run_rank, n, fn, _all_reduce_input, length)
        xs = [_all_reduce_input(r, n, length) for r in range(n)]
        message = _diagnose_all_reduce(n, xs, [out for out, _, _ in results])
        if message:
            if length % n and even_passed:
                message = (
                    f"correct when N divides the length, wrong for length {length} on {n} "
                    f"ranks: pad to a multiple of N, then cut the padding off. {message}"
                )
            fail(message)
        even_passed = even_passed or length % n == 0
        _check_ledger(
            "ring all-reduce", n, [o for _, o, _ in results], [s for _, _, s in results],
            theory.ring_all_reduce_bytes(length, n),
        )  # fmt: skip
    passed("ring all-reduce equals dist.all_reduce on 2, 3 and 4 ranks; 2(N-1)/N·S sent per rank")


def _decode_sum(value: float, n: int) -> tuple[frozenset[int], int] | None:
    """A sum of inputs 2^r + 2^N·i over distinct ranks r -> (ranks, i); None if it is not."""
    if value != int(value) or value < 0:
        return None
    v = int(value)
    mask = v % 2**n
    ranks = frozenset(r for r in range(n) if mask >> r & 1)
    rest = v >> n
    if not ranks or rest % len(ranks):
        return None
    return ranks, rest // len(ranks)


def _diagnose_all_reduce(n: int, xs: list, outs: list) -> str | None:
    """None when every rank returned the sum, else the most likely mistake."""
    expected = torch.stack(xs).sum(0)
    length, chunk = expected.numel(), -(-expected.numel() // n)
    for rank, out in enumerate(outs):
        if not isinstance(out, torch.Tensor):
            return f"rank {rank} returned {type(out).__name__}; return the summed tensor."
        if out.numel() == chunk * n and chunk * n != length:
            return (
                f"rank {rank} returned {out.numel()} elements for an input of {length}: "
                "cut the padding off before returning."
            )
        if out.shape != expected.shape:
            return (
                f"rank {rank} returned shape {tuple(out.shape)}, expected {tuple(expected.shape)}."
            )
    if all(torch.equal(out, expected) for out in outs):
        return None
    if all(torch.equal(out, x) for out, x in zip(outs, xs)):
        return "every rank returned its own input unchanged: nothing was summed into the result."
    if all(torch.allclose(out, expected / n) for out in outs):
        return f"the result is the sum divided by N={n}: an all-reduce sums, it does not average."
    decoded = [[_decode_sum(v, n) for v in out.tolist()] for out in outs]
    everyone = frozenset(range(n))
    for rank, elems in enumerate(decoded):
        if any(d is None for d in elems):
            return _first_mismatch(rank, outs[rank], expected, n, "is not a sum of the inputs")
        complete = {i // chunk for i, (ranks, _) in enumerate(elems) if ranks == everyone}
        places = [idx == i for i, (_, idx) in enumerate(elems)]
        if all(places) and len(complete) == 1:
            (c,) = complete
            return (
                f"on rank {rank} only chunk {c} holds the full sum, the others hold partial sums: "
                "that is where the reduce-scatter phase ends. Forgot the all-gather phase (N-1 "
                "more steps that copy each finished chunk around the ring)."
            )
        if all(places) and len(complete) < (length + chunk - 1) // chunk:
            missing = next(ranks for ranks, _ in elems if ranks != everyone)
            return (
                f"rank {rank} holds sums of only ranks {sorted(missing)} in some places: a chunk "
                "was passed on before it collected every contribution. Check the chunk indices: "
                "at reduce-scatter step s rank r sends chunk (r - s) % N and adds the incoming "
                "one into chunk (r - s - 1) % N (an off-by-one chunk index)."
            )
        if all(ranks == everyone for ranks, _ in elems):
            shift = (elems[0][1] // chunk) % n
            return (
                f"rank {rank} has the right sums in the wrong places (its chunk 0 holds the sum "
                f"of chunk {shift}): the chunks are rotated. Check the all-gather indices: at "
                "step s rank r sends chunk (r + 1 - s) % N and receives chunk (r - s) % N."
            )
    rank = next(r for r, out in enumerate(outs) if not torch.equal(out, expected))
    return _first_mismatch(rank, outs[rank], expected, n, "is wrong")


def _first_mismatch(rank: int, out, expected, n: int, what: str) -> str:
    i = int((out != expected).nonzero()[0])
    return (
        f"on {n} ranks, rank {rank} element {i} {what}: got {out[i].item():g}, expected "
        f"{expected[i].item():g}. Check which chunk is sent and which is received at each step."
    )


def check_ring_all_gather(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Check `fn(chunk) -> tensor`: every rank's chunk concatenated in rank order, on a ring."""
    for n, length in ALL_GATHER_CASES:
        results = run_on_world(_run_rank, n, fn, _all_gather_input, length)
        xs = [_all_gather_input(r, n, length) for r in range(n)]
        message = _diagnose_all_gather(n, xs, [out for out, _, _ in results])
        if message:
            fail(message)
        _check_ledger(
            "ring all-gather", n, [o for _, o, _ in results], [s for _, _, s in results],
            theory.ring_all_gather_bytes(length, n),
        )  # fmt: skip
    passed("ring all-gather equals dist.all_gather on 2, 3 and 4 ranks; (N-1)/N·S sent per rank")


def _diagnose_all_gather(n: int, xs: list, outs: list) -> str | None:
    """None when every rank returned all chunks in rank order, else the most likely mistake."""
    expected = torch.cat(xs)
    length = xs[0].numel()
    for rank, out in enumerate(outs):
        if not isinstance(out, torch.Tensor):
            return f"rank {rank} returned {type(out).__name__}; return the gathered tensor."
        if out.numel() != expected.numel():
            return f"rank {rank} returned {out.numel()} elements; expected N × {length}."
    if all(torch.equal(out.reshape(-1), expected) for out in outs):
        return None
    for rank, out in enumerate(outs):
        blocks = out.reshape(n, length)
        sources = [_block_source(b, xs) for b in blocks]
        if sources == list(range(n)):
            continue
        if all(s is not None for s in sources) and len(set(sources)) == n:
            rotated = all(s == (sources[0] + b) % n for b, s in enumerate(sources))
            how = f"rotated by {sources[0]}" if rotated else "in the wrong order"
            return (
                f"rank {rank} has every chunk but {how}: its blocks hold the chunks of ranks "
                f"{sources}. The chunk received at step s came from rank (r - s - 1) % N; store it "
                "at that block, not in arrival order."
            )
        if set(s for s in sources if s is not None) <= {rank, (rank - 1) % n} and n > 2:
            return (
                f"rank {rank} only ever got its left neighbour's chunk: at each step forward the "
                "chunk you received in the previous step, not your own one again."
            )
        missing = sorted(set(range(n)) - set(s for s in sources if s is not None))
        return (
            f"on {n} ranks, rank {rank} is missing the chunks of ranks {missing} (block sources "
            f"{sources}): an all-gather on a ring needs N-1 steps, each passing on one chunk."
        )
    return None


def _block_source(block: torch.Tensor, xs: list) -> int | None:
    return next((r for r, x in enumerate(xs) if torch.equal(block, x)), None)
