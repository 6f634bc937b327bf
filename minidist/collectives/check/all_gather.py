"""collectives checker: all-gather."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...course.check import passed
from .. import theory
from ._shared import ALL_GATHER_CASES, _all_gather_input
from .all_reduce import _check_on_worlds


def check_ring_all_gather(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Check `fn(chunk) -> tensor`: every rank's chunk concatenated in rank order, on a ring."""
    _check_on_worlds(
        "ring all-gather",
        fn,
        ALL_GATHER_CASES,
        _all_gather_input,
        lambda n, length, xs, outs, sent: _diagnose_all_gather(n, xs, outs, sent),
        theory.ring_all_gather_bytes,
    )
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
        if out.shape != expected.shape:
            return (
                f"rank {rank} returned shape {tuple(out.shape)}: the chunks concatenated are one "
                f"flat tensor of N × {length} = {expected.numel()} elements (reshape(-1))."
            )
    for rank, chunks in enumerate(sent):
        if len(chunks) > n - 1:
            return (
                f"rank {rank} made {len(chunks)} ring steps; an all-gather on a ring of N = {n} "
                f"needs N-1 = {n - 1} (after N-1 steps every rank holds every chunk; one more "
                "sends a chunk its neighbour already has): loop over range(N - 1)."
            )
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
