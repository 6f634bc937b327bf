"""collectives checker: all-reduce."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...course.check import fail, passed
from .. import theory
from ._shared import AG, ALL_REDUCE_CASES, RS, RULES, _all_reduce_input, _check_ledger, _run


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
        "ring all-reduce",
        fn,
        ALL_REDUCE_CASES,
        _all_reduce_input,
        lambda n, length, xs, outs, sent: (
            _diagnose_sends(n, length, sent, outs) or _diagnose_all_reduce(n, xs, outs)
        ),
        theory.ring_all_reduce_bytes,
    )
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
