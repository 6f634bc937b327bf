"""fsdp checker: exercise 1: flatten, pad, shard."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ...course.check import fail, passed
from ..theory import padded

# (parameter shapes, worlds): the paper's 15 elements on 16 ranks; a Linear(5, 3) (18
# elements: no padding on 1, 2 and 3 ranks, 2 on 4); three small tensors (11: 1 of padding).
FLAT_CASES = [([(15,)], (16,)), ([(3, 5), (3,)], (1, 2, 3, 4)), ([(2, 3), (1,), (4,)], (4, 2))]


def _numel(shape: Sequence[int]) -> int:
    return int(torch.Size(shape).numel())


def _flat_params(shapes) -> list[torch.nn.Parameter]:
    """Parameters whose values are their flat positions + 1 (so 0 can only be padding)."""
    out, start = [], 1
    for shape in shapes:
        n = _numel(shape)
        values = torch.arange(start, start + n, dtype=torch.float32, device="cpu").reshape(shape)
        out.append(torch.nn.Parameter(values))
        start += n
    return out


def _diagnose_flatten(out, shapes, rank: int, world: int) -> str | None:
    total = sum(_numel(s) for s in shapes)
    full = padded(total, world)
    c = full // world
    expected_offsets = [sum(_numel(s) for s in shapes[:i]) for i in range(len(shapes))]
    if not (isinstance(out, tuple | list) and len(out) == 2):
        return f"return a pair (chunk, offsets); got {type(out).__name__}."
    chunk, offsets = out
    if not isinstance(chunk, torch.Tensor):
        return f"the chunk must be a tensor; got {type(chunk).__name__}."
    offsets = [int(o) for o in offsets]
    if offsets != expected_offsets:
        ends = [o + _numel(s) for o, s in zip(expected_offsets, shapes)]
        if offsets == ends:
            return (
                f"offsets {offsets} are where the parameters end; offsets[i] is where parameter "
                f"i starts, the sum of numel() of the parameters before it: {expected_offsets}."
            )
        if offsets == list(range(len(shapes))):
            return (
                f"offsets {offsets} are the parameters' indices; an offset is a position in the "
                f"flat buffer, the sum of numel() of the parameters before it: {expected_offsets}."
            )
        return f"offsets {offsets}, expected {expected_offsets} (where each parameter starts)."
    got = chunk.detach().reshape(-1).float()
    if got.numel() != c:
        if got.numel() == total // world and total % world:
            return (
                f"the chunk has {got.numel()} elements = {total} // {world}: without padding "
                f"the last {total % world} elements belong to no rank. Pad the flat buffer with "
                f"zeros to a multiple of N ({full}) and give every rank {c}."
            )
        if got.numel() in (total, full) and world > 1:
            return (
                f"the chunk has {got.numel()} elements: the whole flat buffer. Rank {rank} keeps "
                f"only its chunk of {full} / {world} = {c} elements, [{rank * c}, "
                f"{(rank + 1) * c})."
            )
        return (
            f"the chunk has {got.numel()} elements; every rank's chunk has "
            f"ceil({total} / {world}) = {c} (the flat buffer padded to {full}, cut in {world})."
        )
    flat = torch.zeros(full, device="cpu")
    flat[:total] = torch.arange(1, total + 1, dtype=torch.float32, device="cpu")
    want = flat[rank * c : (rank + 1) * c]
    if torch.equal(got, want):
        return None
    valid = want != 0
    if torch.equal(got[valid], want[valid]):
        return (
            f"the parameters' elements are right but the padding holds {got[~valid].tolist()}: "
            "pad with zeros (torch.zeros), so that padding adds nothing to a sum or a norm."
        )
    for other in range(world):
        if other != rank and torch.equal(got, flat[other * c : (other + 1) * c]):
            return (
                f"rank {rank} returned the chunk of rank {other} (elements [{other * c}, "
                f"{(other + 1) * c})); rank r owns elements [r·c, (r+1)·c) of the padded buffer."
            )
    if torch.equal(got, flat[rank::world]):
        return (
            "the chunk is every N-th element (a strided shard). FSDP's chunk is contiguous: "
            f"rank {rank} owns elements [{rank * c}, {(rank + 1) * c}), so that all-gathering "
            "the chunks in rank order rebuilds the flat buffer."
        )
    return (
        f"the chunk holds {got.tolist()[:8]}..., expected flat elements [{rank * c}, "
        f"{(rank + 1) * c}) = {want.tolist()[:8]}...: flatten each parameter with .reshape(-1) "
        "in the order given and concatenate."
    )


def check_flatten_and_shard(flatten_and_shard: Callable) -> None:
    """Every rank of several worlds (15 elements on 16 ranks included); name the mistake."""
    for shapes, worlds in FLAT_CASES:
        for world in worlds:
            for rank in range(world):
                out = flatten_and_shard(_flat_params(shapes), rank, world)
                problem = _diagnose_flatten(out, shapes, rank, world)
                if problem:
                    total = sum(_numel(s) for s in shapes)
                    fail(
                        f"parameters of shapes {shapes} ({total} elements) on {world} ranks, "
                        f"rank {rank}: {problem}"
                    )
    passed(
        "flatten_and_shard pads to a multiple of N and gives rank r elements [r·c, (r+1)·c) "
        "on every rank of worlds 1-4 and 16 (15 elements on 16 ranks: rank 15 holds padding)"
    )
