"""Checkers for lesson 00: a ring all-reduce and a ring all-gather built from send/recv.

Each checker runs the learner's function on worlds of 2, 3 and 4 ranks (odd sizes, lengths
that do not divide by N) and compares with the collective it imitates. Inputs are chosen so
that every value says where it came from, and the ledger keeps a copy of every chunk each
rank sent, so a wrong answer is explained by phase, step and chunk:

- all-reduce input on rank r, element i: 2^r + 2^N·i. A sum over a set of ranks S keeps S in
  its low N bits and the element index above them, so any sent or returned value decodes
  into "sum of ranks S of element i". The ring's schedule says what rank r must send at
  every step (Patarasuk & Yuan 2009, section 3): at reduce-scatter step s chunk (r-s) mod N
  holding the sum of ranks r, r-1, ..., r-s; at all-gather step s chunk (r+1-s) mod N
  holding the sum of all ranks. The first send that differs names the mistake.
- all-gather input on rank r, element i: 100·r + i, so each block names its source; what a
  rank received at step s is what its left neighbour sent at step s.

Then the ledger must show only send/recv, and each rank must send what the ring sends
(`theory.ring_all_reduce_bytes`, `theory.ring_all_gather_bytes`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from .. import comm
from ..course.check import fail, passed, run_on_world
from ..runtime import RankFailedError
from . import theory

ALL_REDUCE_CASES = [(2, 8), (4, 8), (3, 9), (3, 7), (4, 10)]  # (world, length)
ALL_GATHER_CASES = [(2, 3), (4, 2), (3, 5), (4, 1)]  # (world, chunk length)
RING_HANG_HINT = (
    "In a ring, rank r sends to rank (r + 1) % N and receives from rank (r - 1) % N, and "
    "every send must pair with a receive of the same size on its peer in the same step: "
    "post both with one comm.batch_isend_irecv, with the right peers, and wait on both."
)
RS, AG = "reduce-scatter", "all-gather"
RULES = {
    RS: "at reduce-scatter step s rank r sends chunk (r - s) % N and adds the incoming one "
    "into chunk (r - s - 1) % N",
    AG: "at all-gather step s rank r sends chunk (r + 1 - s) % N and copies the incoming one "
    "into chunk (r - s) % N",
}


def _all_reduce_input(rank: int, n: int, length: int) -> torch.Tensor:
    return 2.0**rank + 2.0**n * torch.arange(length, dtype=torch.float32)


def _all_gather_input(rank: int, n: int, length: int) -> torch.Tensor:
    return 100.0 * rank + torch.arange(length, dtype=torch.float32)


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
        return run_on_world(_run_rank, n, fn, make_input, length, hang_hint=RING_HANG_HINT)
    except RankFailedError as exc:
        if "size" in str(exc).lower() and "match" in str(exc).lower():
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


# -- all-reduce ------------------------------------------------------------------------------


def _check_on_worlds(name, fn, cases, make_input, diagnose, expected_bytes) -> None:
    """Run `fn` on each (world, length) case; fail with `diagnose`'s message or a ledger one."""
    for n, length in cases:
        results = _run(name, n, fn, make_input, length)
        xs = [make_input(r, n, length) for r in range(n)]
        outs, ops, sent_bytes, sent = zip(*results)
        message = diagnose(n, length, xs, list(outs), list(sent))
        if message:
            fail(f"on {n} ranks with {length} elements: {message}")
        _check_ledger(name, n, list(ops), list(sent_bytes), expected_bytes(length, n))


def check_ring_all_reduce(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Check `fn(tensor) -> tensor`: the sum of `tensor` over all ranks, built on a ring."""
    _check_on_worlds(
        "ring all-reduce", fn, ALL_REDUCE_CASES, _all_reduce_input,
        lambda n, length, xs, outs, sent: _diagnose_sends(n, length, sent, outs)
        or _diagnose_all_reduce(n, xs, outs),
        theory.ring_all_reduce_bytes,
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


def _expected_send(rank: int, k: int, n: int) -> tuple[str, int, int, frozenset[int]]:
    """(phase, step, chunk, ranks summed in it) of the k-th chunk rank `rank` sends."""
    if k < n - 1:
        return RS, k, (rank - k) % n, frozenset((rank - j) % n for j in range(k + 1))
    s = k - (n - 1)
    return AG, s, (rank + 1 - s) % n, frozenset(range(n))


def _diagnose_sends(n: int, length: int, sent: list[list], outs: list) -> str | None:
    """Compare every chunk each rank sent with the ring's schedule; None if all match."""
    chunk = theory.chunk_numel(length, n)
    steps = theory.ring_all_reduce_steps(n)
    for rank, chunks in enumerate(sent):
        sizes = sorted({c.numel() for c in chunks})
        if chunks and sizes != [chunk]:
            return (
                f"rank {rank} sent chunks of {sizes} elements; every ring step sends one chunk "
                f"of ceil({length}/{n}) = {chunk}. Without padding, {length} elements do not "
                f"cut into {n} equal chunks: pad with zeros to {chunk * n} elements, run the "
                "ring on the padded tensor, then cut the padding off."
            )
    for rank, chunks in enumerate(sent):
        if len(chunks) > steps:
            both = "both phases" if len(chunks) >= 2 * n else "one phase"
            return (
                f"rank {rank} made {len(chunks)} ring steps; the ring makes N-1 = {n - 1} "
                f"reduce-scatter steps and N-1 = {n - 1} all-gather steps, {steps} in all. "
                f"It looks like {both} ran N = {n} steps instead of N-1: loop over range(N - 1)."
            )
        for k, got in enumerate(chunks):
            phase, step, want_chunk, want_ranks = _expected_send(rank, k, n)
            decoded = _decode_sum(float(got[0]), n)
            if decoded is None:
                return (
                    f"at {phase} step {step} rank {rank} sent values that are not sums of "
                    f"the inputs ({got.tolist()}); {RULES[phase]}."
                )
            ranks, index = decoded
            got_chunk = index // chunk
            if (got_chunk, ranks) == (want_chunk, want_ranks):
                continue
            held = f"the sum of ranks {sorted(ranks)}"
            want = f"chunk {want_chunk} holding the sum of ranks {sorted(want_ranks)}"
            if got_chunk != want_chunk:
                return (
                    f"at {phase} step {step} rank {rank} sent chunk {got_chunk} ({held}) where "
                    f"the ring sends {want}: an off-by-one chunk index. {RULES[phase]}."
                )
            return (
                f"at {phase} step {step} rank {rank} sent chunk {got_chunk}, the right one, but "
                f"it held {held}, not {sorted(want_ranks)}: what arrived at step {step - 1} "
                f"was not stored in chunk {got_chunk}. "
                f"{_misplaced(rank, outs[rank], n, chunk) or RULES[phase]}."
            )
    return None


def _misplaced(rank: int, out, n: int, chunk: int) -> str:
    """If rank's result holds some chunk's complete sum in another chunk: which step did it."""
    if not isinstance(out, torch.Tensor) or out.numel() < 1:
        return ""
    flat = out.reshape(-1)
    found = []  # (step, chunk, block)
    for block in range(min(n, -(-flat.numel() // chunk))):
        decoded = _decode_sum(float(flat[block * chunk]), n)
        if decoded and decoded[0] == frozenset(range(n)) and decoded[1] // chunk != block:
            c = decoded[1] // chunk
            found.append(((rank - c) % n, c, block))
    if not found:
        return ""
    step, c, block = min(found)  # the earliest step: later ones inherit its damage
    return (
        f"at all-gather step {step} rank {rank} received chunk {c}'s complete sum and copied "
        f"it into chunk {block}; it belongs in chunk (r - s) % N = {c}"
    )


def _diagnose_all_reduce(n: int, xs: list, outs: list) -> str | None:
    """None when every rank returned the sum, else the most likely mistake."""
    expected = torch.stack(xs).sum(0)
    length, chunk = expected.numel(), theory.chunk_numel(expected.numel(), n)
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
            return _first_mismatch(rank, outs[rank], expected, "is not a sum of the inputs")
        complete = {i // chunk for i, (ranks, _) in enumerate(elems) if ranks == everyone}
        places = [idx == i for i, (_, idx) in enumerate(elems)]
        if all(places) and len(complete) == 1:
            (c,) = complete
            return (
                f"on rank {rank} only chunk {c} holds the full sum, the others hold partial sums: "
                "that is where the reduce-scatter phase ends. Forgot the all-gather phase (N-1 "
                "more steps that copy each finished chunk around the ring)."
            )
        if all(ranks == everyone for ranks, _ in elems):
            shift = (elems[0][1] // chunk) % n
            return (
                f"rank {rank} has the right sums in the wrong places (its chunk 0 holds the sum "
                f"of chunk {shift}): the chunks are rotated. {RULES[AG]}."
            )
    for rank, out in enumerate(outs):
        misplaced = _misplaced(rank, out, n, chunk)
        if misplaced:
            return f"{misplaced}. {RULES[AG]}."
    rank = next(r for r, out in enumerate(outs) if not torch.equal(out, expected))
    return _first_mismatch(rank, outs[rank], expected, "is wrong")


def _first_mismatch(rank: int, out, expected, what: str) -> str:
    i = int((out != expected).nonzero()[0])
    return (
        f"rank {rank} element {i} {what}: got {out[i].item():g}, expected "
        f"{expected[i].item():g}. {RULES[RS]}; {RULES[AG]}."
    )


# -- all-gather ------------------------------------------------------------------------------


def check_ring_all_gather(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Check `fn(chunk) -> tensor`: every rank's chunk concatenated in rank order, on a ring."""
    _check_on_worlds(
        "ring all-gather", fn, ALL_GATHER_CASES, _all_gather_input,
        lambda n, length, xs, outs, sent: _diagnose_all_gather(n, xs, outs, sent),
        theory.ring_all_gather_bytes,
    )  # fmt: skip
    passed("ring all-gather equals dist.all_gather on 2, 3 and 4 ranks; (N-1)/N·S sent per rank")


def _diagnose_all_gather(n: int, xs: list, outs: list, sent: list[list]) -> str | None:
    """None when every rank returned all chunks in rank order, else the most likely mistake.

    `sent[r]` are the chunks rank r sent, step by step: what rank r+1 received.
    """
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
        sources = [_block_source(b, xs) for b in out.reshape(n, length)]
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
        misplaced = _misplaced_block(rank, n, xs, sources, sent[(rank - 1) % n])
        if misplaced:
            return misplaced
        missing = sorted(set(range(n)) - set(s for s in sources if s is not None))
        return (
            f"rank {rank} is missing the chunks of ranks {missing} (block sources {sources}): "
            f"it made {len(sent[rank])} steps; an all-gather on a ring needs N-1 = {n - 1}, "
            "each passing on the chunk received in the step before."
        )
    return None


def _misplaced_block(rank: int, n: int, xs: list, sources: list, received: list) -> str | None:
    """The first step whose received chunk is not in the block it belongs in, explained."""
    for step, chunk in enumerate(received[: n - 1]):
        source = _block_source(chunk, xs)
        block = (rank - step - 1) % n
        if source is None or sources[block] == source:
            continue
        where = (
            f"you stored it in block {sources.index(source)}"
            if source in sources
            else "it is not in your output (a later step overwrote it)"
        )
        return (
            f"at step {step} rank {rank} received rank {source}'s chunk; it belongs in block "
            f"(r - s - 1) % N = {block}, but {where}. Store what arrives at step s in the block "
            "of the rank it came from."
        )
    return None


def _block_source(block: torch.Tensor, xs: list) -> int | None:
    return next((r for r, x in enumerate(xs) if torch.equal(block, x)), None)
