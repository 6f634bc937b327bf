"""zero checker: exercise 1: shard with padding."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from ...course.check import fail, passed, run_on_world
from ...runtime import RankFailedError
from ._shared import _and

SHARD_CASES = {  # world -> shapes: padding of 1 to N-1, none, and ranks owning padding only
    2: [(3,), (2, 4)],
    3: [(7,), (2, 2)],
    4: [(3, 5), (2, 3), (10,), (2, 4)],
}


def _numbered(shape: tuple[int, ...]) -> torch.Tensor:
    """Elements 1, 2, 3, ...: a value says which flat element it is; 0 is padding."""
    n = 1
    for s in shape:
        n *= s
    return torch.arange(1, n + 1, dtype=torch.float32, device="cpu").reshape(shape)


def _padded(numel: int, world: int) -> torch.Tensor:
    chunk = -(-numel // world)
    return torch.cat(
        [
            torch.arange(1, numel + 1, dtype=torch.float32, device="cpu"),
            torch.zeros(chunk * world - numel, device="cpu"),
        ]
    )


def _shard_rank(fn: Callable, shapes: list[tuple[int, ...]]) -> list[dict]:
    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for shape in shapes:
        t = _numbered(shape)
        got = fn(t, rank, world)
        got = got.detach().clone() if isinstance(got, torch.Tensor) else type(got).__name__
        out.append(dict(got=got, mutated=not torch.equal(t, _numbered(shape))))
    return out


def _which_elements(got: torch.Tensor, numel: int) -> str:
    """The flat indices `got` holds, 0-based, "pad" for zeros."""
    names = []
    for v in got.tolist():
        if v == 0:
            names.append("pad")
        elif v == int(v) and 1 <= v <= numel:
            names.append(str(int(v) - 1))
        else:
            names.append(f"{v:g}?")
    return "[" + ", ".join(names) + "]"


def _diagnose_shards(world: int, shape: tuple[int, ...], outs: list) -> str | None:
    numel = _numbered(shape).numel()
    chunk = -(-numel // world)
    padded = _padded(numel, world)
    what = f"a tensor of shape {tuple(shape)} ({numel} elements) on {world} ranks"
    rule = (
        f"pad with zeros to {chunk * world} elements (the next multiple of N={world}) and give "
        f"rank r elements [r·{chunk}, (r+1)·{chunk})"
    )
    for rank, got in enumerate(outs):
        if not isinstance(got, torch.Tensor):
            return f"{what}: rank {rank} returned a {got}; return the chunk as a tensor."
        if got.dim() != 1:
            return (
                f"{what}: rank {rank} returned shape {tuple(got.shape)}: flatten first "
                "(tensor.reshape(-1)); a chunk is a 1-D piece of the flat tensor."
            )
    sizes = [got.numel() for got in outs]
    if sizes != [chunk] * world:
        if sum(sizes) == numel and len(set(sizes)) > 1:
            return (
                f"{what}: the chunks have {sizes} elements: without padding {numel} elements do "
                f"not cut into {world} equal chunks (torch.chunk and tensor_split make the last "
                f"ones shorter). Every rank needs the same size for a collective: {rule}."
            )
        if set(sizes) == {numel // world} and numel % world:
            return (
                f"{what}: every rank got {numel} // {world} = {numel // world}, so the last "
                f"{numel % world} of the {numel} elements belong to no rank. Round up to "
                f"ceil({numel}/{world}) = {chunk} per rank: {rule}."
            )
        if set(sizes) == {chunk + 1} and numel % world == 0:
            return (
                f"{what}: every rank got {chunk + 1} elements, but {numel} already divides by "
                f"{world}: pad (-numel) % N elements, which is 0 here, not N."
            )
        rank = next(r for r, s in enumerate(sizes) if s != chunk)
        return (
            f"{what}: rank {rank} returned {sizes[rank]} elements; every chunk has "
            f"ceil({numel}/{world}) = {chunk}: {rule}."
        )
    for rank, got in enumerate(outs):
        want = padded[rank * chunk : (rank + 1) * chunk]
        if torch.equal(got, want):
            continue
        real = want != 0
        if torch.equal(got[real], want[real]):
            return (
                f"{what}: rank {rank}'s padding holds {got[~real].tolist()} instead of zeros. "
                "Pad with zeros (torch.zeros, or F.pad): a padded gradient is summed by the "
                "reduce-scatter and would enter the global gradient norm."
            )
        others = [j for j in range(world) if torch.equal(got, padded[j * chunk : (j + 1) * chunk])]
        if others:
            return (
                f"{what}: rank {rank} returned chunk {others[0]} (elements "
                f"{_which_elements(got, numel)}); rank r owns chunk r, elements "
                f"[r·{chunk}, (r+1)·{chunk}) = {_which_elements(want, numel)} for rank {rank}."
            )
        if torch.equal(got, padded[rank::world]):
            return (
                f"{what}: rank {rank} got one element in every {world}, "
                f"{_which_elements(got, numel)}: a strided split. Rank r owns one contiguous "
                f"block, elements [r·{chunk}, "
                f"(r+1)·{chunk}) = {_which_elements(want, numel)}: what a reduce-scatter hands "
                "rank r and an all-gather puts back in rank order."
            )
        front = torch.cat([torch.zeros(chunk * world - numel, device="cpu"), padded[:numel]])
        if torch.equal(got, front[rank * chunk : (rank + 1) * chunk]):
            return (
                f"{what}: the padding went in front of the elements (rank {rank} holds "
                f"{_which_elements(got, numel)}); pad at the end, so every parameter keeps its "
                "offset from the start of the flat buffer."
            )
        return (
            f"{what}: rank {rank} holds elements {_which_elements(got, numel)} of the flattened "
            f"tensor (0-based) but owns {_which_elements(want, numel)}: {rule}."
        )
    return None


def check_shard_with_padding(shard_with_padding: Callable) -> None:
    """Run `shard_with_padding(tensor, rank, world_size)` on every rank of worlds of 2, 3, 4."""
    for world, shapes in SHARD_CASES.items():
        try:
            results = run_on_world(_shard_rank, world, shard_with_padding, shapes)
        except RankFailedError as exc:
            if "IndexError" in str(exc):
                fail(
                    f"on {world} ranks rank {exc.rank} asked for a chunk that does not exist: "
                    "torch.chunk(t, N) returns fewer than N chunks when N does not divide the "
                    "size (6 elements in 4 chunks: 3 chunks of 2). Pad with zeros to a "
                    "multiple of N first, then cut N equal chunks."
                )
            raise
        for case, shape in enumerate(shapes):
            problem = _diagnose_shards(world, shape, [r[case]["got"] for r in results])
            if problem:
                fail(problem)
            if any(r[case]["mutated"] for r in results):
                fail(
                    f"the chunks are right but the input tensor of shape {shape} changed: work "
                    "on a flat copy (torch.cat / F.pad make one), the parameter must not change."
                )
    passed(
        "shard_with_padding gives every rank ceil(numel/N) elements, chunk r of the zero-padded "
        f"flat tensor, for N = {_and(SHARD_CASES)} (15 elements on 4 ranks: chunks of 4, one "
        "padding zero)"
    )
