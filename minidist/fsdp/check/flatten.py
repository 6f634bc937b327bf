"""fsdp checker: exercise 1: flatten, pad, shard."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ...course.check import call_learner, fail, passed
from ..theory import padded

# (parameter shapes, worlds[, kind]): the paper's 15 elements on 16 ranks; a Linear(5, 3)
# (18 elements: no padding on 1, 2 and 3 ranks, 2 on 4); three small tensors (11: 1 of
# padding); a transposed (non-contiguous) weight; bfloat16 parameters (the chunk keeps them).
FLAT_CASES = [
    ([(15,)], (16,)),
    ([(3, 5), (3,)], (1, 2, 3, 4)),
    ([(2, 3), (1,), (4,)], (4, 2)),
    ([(5, 3), (5,)], (3, 2), "T"),
    ([(2, 3), (4,)], (3, 4), "bf16"),
]
FLAT_HINTS = {
    r"view size is not compatible": "a transposed weight (W.t()) is not contiguous, and "
    ".view(-1) refuses it: flatten with .reshape(-1)",
    r"^IndexError": "a chunk index past the end: pad the flat buffer to a multiple of N first, "
    "then rank r's chunk is [r·c, (r+1)·c), c = padded // N",
}


def _numel(shape: Sequence[int]) -> int:
    return int(torch.Size(shape).numel())


def _flat_params(shapes, kind: str = "") -> list[torch.nn.Parameter]:
    """Parameters whose values are their flat positions + 1 (so 0 can only be padding); with
    kind "T" the first is stored transposed (same values, not contiguous), with "bf16" all
    are bfloat16 (integers up to 256 are exact)."""
    out, start = [], 1
    for i, shape in enumerate(shapes):
        n = _numel(shape)
        values = torch.arange(start, start + n, dtype=torch.float32, device="cpu").reshape(shape)
        if kind == "T" and i == 0:
            values = values.t().contiguous().t()
        out.append(torch.nn.Parameter(values.to(torch.bfloat16) if kind == "bf16" else values))
        start += n
    return out


def _diagnose_tensor(chunk: torch.Tensor, params: list) -> str | None:
    """What the spec says of the chunk besides its values: dtype, outside autograd, new."""
    want = params[0].dtype
    if chunk.dtype != want:
        return (
            f"the chunk is {str(chunk.dtype)[6:]} but the parameters are {str(want)[6:]}: keep "
            "their dtype (torch.zeros(n) is float32 unless given dtype=params[0].dtype, and "
            "copying bf16 into it widens it; FSDP's flat parameter has the parameters' dtype)."
        )
    if chunk.requires_grad or chunk.grad_fn is not None:
        fn = type(chunk.grad_fn).__name__ if chunk.grad_fn is not None else "none"
        return (
            f"the chunk is still in the parameters' autograd graph (requires_grad="
            f"{chunk.requires_grad}, grad_fn={fn}): build it from p.detach() (or under "
            "torch.no_grad()). The shard is a new leaf the optimizer steps, not a function of "
            "the parameters it replaces."
        )
    ptrs = {p.untyped_storage().data_ptr() for p in params}
    if chunk.untyped_storage().data_ptr() in ptrs:
        return (
            "the chunk is a view of a parameter's storage: return a new tensor (.clone() it), "
            "so that freeing or replacing the parameters leaves the shard intact."
        )
    return None


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
    if not isinstance(offsets, list | tuple):
        return f"offsets must be a list of ints; got {type(offsets).__name__}."
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
        shifts = {o - e for o, e in zip(offsets, expected_offsets)}
        if len(shifts) == 1 and len(offsets) == len(expected_offsets):
            (d,) = shifts
            return (
                f"offsets {offsets} are all {abs(d)} too {'large' if d > 0 else 'small'}: an "
                f"off-by-one. The first parameter starts at 0; offsets[i] is the sum of numel() "
                f"of the parameters before it: {expected_offsets}."
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
    for shapes, worlds, *kind in FLAT_CASES:
        kind = kind[0] if kind else ""
        what = {"T": ", the first transposed (not contiguous),", "bf16": " in bfloat16"}
        total = sum(_numel(s) for s in shapes)
        for world in worlds:
            for rank in range(world):
                where = (
                    f"parameters of shapes {shapes}{what.get(kind, '')} ({total} elements) on "
                    f"{world} ranks, rank {rank}"
                )
                params = _flat_params(shapes, kind)
                out = call_learner(
                    flatten_and_shard, params, rank, world, hints=FLAT_HINTS, what=where
                )
                problem = _diagnose_flatten(out, shapes, rank, world)
                if problem is None and isinstance(out[0], torch.Tensor):
                    problem = _diagnose_tensor(out[0], params)
                if problem:
                    fail(f"{where}: {problem}")
    passed(
        "flatten_and_shard pads to a multiple of N and gives rank r elements [r·c, (r+1)·c) "
        "on every rank of worlds 1-4 and 16 (15 elements on 16 ranks: rank 15 holds padding); "
        "a new tensor outside autograd, in the parameters' dtype (bf16 and transposed included)"
    )
