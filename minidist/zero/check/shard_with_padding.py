"""zero checker: exercise 1: shard with padding."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from ...course.check import fail, passed, run_on_world
from ._shared import _and

# world -> shapes: padding of 1 to N-1, none, and ranks owning padding only; "T" marks a
# transposed (non-contiguous) weight, "bf16" a bfloat16 one: the chunk keeps the dtype.
SHARD_CASES = {
    2: [(3,), (2, 4), ((3, 5), "T")],
    3: [(7,), (2, 2), ((2, 5), "bf16"), ((4, 2), "T")],
    4: [(3, 5), (2, 3), (10,), (2, 4), ((5, 3), "T"), ((3, 3), "bf16")],
}
VIEW_HINT = (
    "some tensors are not contiguous (a transposed weight, W.t(), is one): .view(-1) refuses "
    "them. Flatten with .reshape(-1), which copies only when it must"
)


SHARD_HINTS = {
    r"view size is not compatible|view\(-1\)": VIEW_HINT,
    r"^IndexError": "torch.chunk(t, N) returns fewer than N chunks when N does not divide the "
    "size (6 elements in 4 chunks: 3 chunks of 2), so chunk `rank` may not exist. Pad with "
    "zeros to a multiple of N first, then cut N equal chunks",
}


def _case(case) -> tuple[tuple[int, ...], str]:
    return (case[0], case[1]) if isinstance(case[0], tuple) else (tuple(case), "")


def _numbered(case) -> torch.Tensor:
    """Elements 1, 2, 3, ... in flat (row-major) order: a value says which flat element it
    is; 0 is padding. A "T" case lays them out column-major (a transposed weight)."""
    shape, kind = _case(case)
    n = 1
    for s in shape:
        n *= s
    t = torch.arange(1, n + 1, dtype=torch.float32, device="cpu").reshape(shape)
    if kind == "T":
        t = t.t().contiguous().t()  # same values, non-contiguous
    return t.to(torch.bfloat16) if kind == "bf16" else t


def _describe(case) -> str:
    shape, kind = _case(case)
    what = {"T": " (transposed: not contiguous)", "bf16": " in bfloat16"}.get(kind, "")
    return f"a tensor of shape {shape}{what}"


def _padded(numel: int, world: int) -> torch.Tensor:
    chunk = -(-numel // world)
    return torch.cat(
        [
            torch.arange(1, numel + 1, dtype=torch.float32, device="cpu"),
            torch.zeros(chunk * world - numel, device="cpu"),
        ]
    )


def _shard_rank(fn: Callable, shapes: list) -> list[dict]:
    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for shape in shapes:
        t = _numbered(shape)
        got = fn(t, rank, world)
        dtype = got.dtype if isinstance(got, torch.Tensor) else None
        got = got.detach().float().clone() if dtype is not None else type(got).__name__
        out.append(dict(got=got, dtype=dtype, mutated=not torch.equal(t, _numbered(shape))))
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


def _shifted(outs: list, padded: torch.Tensor, chunk: int) -> int:
    """d (±1) when every rank returned [r·c + d, (r+1)·c + d) of the padded tensor (cut at
    its ends), else 0."""
    for d in (1, -1):
        want = [
            padded[max(0, r * chunk + d) : max(0, (r + 1) * chunk + d)] for r in range(len(outs))
        ]
        if all(torch.equal(got, w) for got, w in zip(outs, want)):
            return d
    return 0


def _diagnose_shards(world: int, shape, outs: list, dtypes: list | None = None) -> str | None:
    numel = _numbered(shape).numel()
    chunk = -(-numel // world)
    padded = _padded(numel, world)
    what = f"{_describe(shape)} ({numel} elements) on {world} ranks"
    want_dtype = _numbered(shape).dtype
    for rank, dtype in enumerate(dtypes or []):
        if dtype is not None and dtype != want_dtype:
            return (
                f"{what}: rank {rank} returned a {str(dtype)[6:]} chunk: keep the tensor's "
                f"dtype, {str(want_dtype)[6:]}. torch.zeros(k) is float32 unless told "
                "dtype=tensor.dtype, and torch.cat promotes to it; F.pad keeps the dtype."
            )
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
    shift = _shifted(outs, padded, chunk)
    if shift:
        return (
            f"{what}: every rank's chunk starts {abs(shift)} element(s) "
            f"{'late' if shift > 0 else 'early'} (rank {world - 1} holds "
            f"{_which_elements(outs[-1], numel)}): an off-by-one in the slice. Rank r owns "
            f"[r·{chunk}, (r+1)·{chunk}): start at rank * chunk, stop before (rank + 1) * chunk."
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
        results = run_on_world(_shard_rank, world, shard_with_padding, shapes, hints=SHARD_HINTS)
        for case, shape in enumerate(shapes):
            problem = _diagnose_shards(
                world, shape, [r[case]["got"] for r in results], [r[case]["dtype"] for r in results]
            )
            if problem:
                fail(problem)
            if any(r[case]["mutated"] for r in results):
                fail(
                    f"the chunks are right but the input, {_describe(shape)}, changed: work "
                    "on a flat copy (torch.cat / F.pad make one), the parameter must not change."
                )
    passed(
        "shard_with_padding gives every rank ceil(numel/N) elements, chunk r of the zero-padded "
        f"flat tensor, for N = {_and(SHARD_CASES)} (15 elements on 4 ranks: chunks of 4, one "
        "padding zero), transposed and bfloat16 tensors included"
    )
