"""Checkers for the FSDP exercises of lesson 03: the three moves of a flat parameter.

Zhao et al. 2023, "PyTorch FSDP", section 3.2.1 (FlatParameter) and 3.3 (unshard, reshard,
reduce-scatter of the flat gradient).

1. `check_flatten_and_shard(flatten_and_shard)`: `flatten_and_shard(params, rank, world)`
   returns `(chunk, offsets)`: the parameters' elements one after another, zero padding up to
   a multiple of N, and rank r's contiguous chunk [r·c, (r+1)·c), c = padded / N; `offsets[i]`
   is where parameter i starts. A pure function, so it is checked in this process for every
   rank of several worlds, the paper's 15 elements on 16 ranks included. Each element's value
   says where it came from (element j of the flat buffer holds j + 1, padding 0), so a wrong
   chunk is named: no padding, another rank's chunk, a strided shard, padding not zero.
2. `check_unshard(unshard, reshard)`: on worlds of 2 and 4, `unshard(full, chunk, offsets,
   shapes)` re-allocates the freed storage of the persistent flat buffer `full`, all-gathers
   every rank's chunk into it and returns views of it shaped like the parameters; `reshard(
   full)` frees the storage again, keeping the tensor. Then the chunks change (an optimizer
   step) and `unshard` runs again: the views of the first call must see the new values, as
   the views autograd saved in forward must in backward. Named: storage not re-allocated,
   views into a temporary, padding inside a view, wrong offsets, storage not freed, the
   tensor replaced instead of its storage freed, views that lost their storage, an all-reduce
   instead of an all-gather.
3. `check_reduce_scatter_grad(reduce_scatter_grad)`: on worlds of 2 and 4, each rank's flat
   (padded) gradient of one MLP unit on its slice of the batch goes in; this rank's chunk of
   the mean over ranks must come out, compared with one process on the whole batch. Named:
   forgot to divide by N, divided twice, nothing reduced, another rank's chunk, the whole
   flat gradient kept, and (from the ledger) an all-reduce where a reduce-scatter sends half
   the bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from .. import comm
from ..course.check import close, fail, passed, run_on_world
from ..data import shard_batch
from ..data_parallel.fixture import build
from ..runtime import RankFailedError
from ..zero.flat import FlatShard
from .theory import padded

WORLDS = (2, 4)

# -- exercise 1: flatten, pad, shard ---------------------------------------------------------

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
        values = torch.arange(start, start + n, dtype=torch.float32).reshape(shape)
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
    flat = torch.zeros(full)
    flat[:total] = torch.arange(1, total + 1, dtype=torch.float32)
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


# -- exercise 2: unshard and reshard ---------------------------------------------------------

UNSHARD_SHAPES = [(3, 5), (3,), (1,)]  # 19 elements: 1 of padding on 2 and on 4 ranks
STEP = 1000.0  # what the "optimizer step" adds to every chunk between the two unshards


def _storage_bytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        _storage_bytes(a) > 0 and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    )


def _read(views) -> list[torch.Tensor | None]:
    """Copies of the learner's views; None for one whose storage is freed (reading it would
    read freed memory)."""
    return [
        v.detach().clone() if isinstance(v, torch.Tensor) and _storage_bytes(v) > 0 else None
        for v in views
    ]


def _unshard_rank(unshard: Callable, reshard: Callable) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    layout = FlatShard([torch.empty(s) for s in UNSHARD_SHAPES], world, rank)
    flat = torch.zeros(layout.padded)
    flat[: layout.numel] = torch.arange(1, layout.numel + 1, dtype=torch.float32)
    chunk = layout.own(flat).clone()
    full = torch.empty(layout.padded)
    full.untyped_storage().resize_(0)  # freed, as between two uses of the unit
    shapes = [torch.Size(s) for s in UNSHARD_SHAPES]
    out: dict = dict(padded=layout.padded, numel=layout.numel, offsets=layout.offsets)
    with comm.record() as ledger:
        views = list(unshard(full, chunk, list(layout.offsets), shapes))
    out["ops"] = [(r.op, r.payload_bytes) for r in ledger.records]
    out["full_bytes"] = _storage_bytes(full)
    out["shared"] = [isinstance(v, torch.Tensor) and _same_storage(v, full) for v in views]
    out["shapes"] = [tuple(v.shape) if isinstance(v, torch.Tensor) else None for v in views]
    out["first"] = _read(views)
    reshard(full)
    out["full_numel_after_reshard"] = full.numel()
    out["full_bytes_after_reshard"] = _storage_bytes(full)
    if full.numel() != layout.padded:  # replaced, not freed: a second round cannot run
        return out
    chunk.add_(STEP)  # the optimizer updated this rank's chunk
    views2 = list(unshard(full, chunk, list(layout.offsets), shapes))
    out["second"] = _read(views2)
    out["first_again"] = _read(views)  # the first views, read after the second gather
    reshard(full)
    return out


def _diagnose_unshard(res: dict, world: int) -> str | None:
    ops = [op for op, _ in res["ops"]]
    padded_bytes = 4 * res["padded"]
    if "all_gather" not in ops:
        if "all_reduce" in ops:
            return (
                "you all-reduced to assemble the flat parameter: an all-reduce sends "
                "2(N-1)/N·S bytes per rank, an all-gather (N-1)/N·S. Use "
                "comm.all_gather(full, chunk): every rank's chunk lands in rank order."
            )
        return (
            f"no comm.all_gather was recorded (ledger: {ops}): gather every rank's chunk into "
            "full with comm.all_gather(full, chunk)."
        )
    if res["full_bytes"] == 0:
        return (
            "after unshard `full` still has no storage: the values went into a temporary "
            "tensor. Gather into `full` itself (after "
            "re-allocating its storage) and return views of it: autograd saves these views "
            "in forward, and backward's re-gather must refill the very same storage."
        )
    for i, (shape, want) in enumerate(zip(res["shapes"], UNSHARD_SHAPES)):
        n = _numel(want)
        if shape is None:
            return f"view {i} is not a tensor."
        size = _numel(shape)
        if size > n and size - n <= res["padded"] - res["numel"]:
            return (
                f"view {i} has {size} elements but parameter {i} has {n}: it runs into the "
                f"{size - n} element(s) of padding at the end of full. Slice "
                "full[offset : offset + numel] and .view(shape)."
            )
        if tuple(shape) != tuple(want):
            return f"view {i} has shape {tuple(shape)}, parameter {i} has {tuple(want)}."
    if not all(res["shared"]):
        bad = [i for i, s in enumerate(res["shared"]) if not s]
        return (
            f"views {bad} are copies, not views of `full` (or views of another tensor): slice "
            "`full` itself (full[a:b].view(shape)) and do not clone, so that the module "
            "computes with the gathered storage and backward's re-gather refills it."
        )
    flat = torch.arange(1, res["numel"] + 1, dtype=torch.float32)
    for i, (got, off) in enumerate(zip(res["first"], res["offsets"])):
        n = _numel(UNSHARD_SHAPES[i])
        want = flat[off : off + n]
        if not close(got.reshape(-1), want):
            first = int(got.reshape(-1)[0]) - 1
            return (
                f"wrong offsets: view {i} starts at flat element {first}, but parameter {i} "
                f"lives at [{off}, {off + n}). Use offsets[i]: the sum of numel() of the "
                "parameters before it."
            )
    if res["full_numel_after_reshard"] != res["padded"]:
        return (
            f"after reshard `full` has {res['full_numel_after_reshard']} elements instead of "
            f"{res['padded']}: you replaced the tensor's data. Keep the tensor (views and "
            "autograd hold it) and free only its storage: full.untyped_storage().resize_(0)."
        )
    if res["full_bytes_after_reshard"] != 0:
        return (
            f"after reshard full's storage still holds {res['full_bytes_after_reshard']} bytes: "
            "nothing was freed (`del full` or `full = None` only drop a name while views hold "
            "the tensor). Free the storage itself: full.untyped_storage().resize_(0)."
        )
    for i, (again, second) in enumerate(zip(res["first_again"], res["second"])):
        if second is None or again is None or not close(again, second):
            return (
                f"after the second unshard the views of the first one (view {i}) do not show "
                "the new values: the second unshard gathered into another storage. Re-allocate "
                "`full`'s own storage in place (full.untyped_storage().resize_(nbytes)), so "
                "that views saved in forward see the values again in backward."
            )
        want = flat[res["offsets"][i] : res["offsets"][i] + _numel(UNSHARD_SHAPES[i])] + STEP
        if not close(second.reshape(-1), want):
            return (
                f"the second unshard returned stale values in view {i}: gather the chunks as "
                "they are now (after the optimizer step), every time."
            )
    if res["ops"].count(("all_gather", padded_bytes)) != 1:
        return f"one all-gather of the padded flat parameter ({padded_bytes} bytes) per unshard."
    return None


def check_unshard(unshard: Callable, reshard: Callable) -> None:
    """Unshard, reshard, step, unshard on worlds of 2 and 4; name the mistake."""
    for world in WORLDS:
        try:
            results = run_on_world(_unshard_rank, world, unshard, reshard)
        except RankFailedError as exc:
            if "storage of size 0" in str(exc) or "SIGSEGV" in str(exc):
                fail(
                    "the all-gather wrote into a tensor with no storage: `full` arrives freed "
                    "(0 bytes). Re-allocate its storage first: "
                    "full.untyped_storage().resize_(full.numel() * full.element_size())."
                )
            raise
        for rank, res in enumerate(results):
            problem = _diagnose_unshard(res, world)
            if problem:
                fail(f"world of {world}, rank {rank}: {problem}")
    passed(
        f"unshard gathers into full's own storage and returns views of it; reshard frees it; "
        f"views from before a reshard see the re-gathered values (N={WORLDS})"
    )


# -- exercise 3: reduce-scatter the flat gradient --------------------------------------------

GRAD_BATCH = 8


def _grad_fixture():
    """Lesson 01's MLP, smaller, with a 3-wide output: 451 trainable elements, 1 of padding
    on 2 and 4 ranks; the frozen first bias is outside the unit."""
    return build("mlp", steps=1, global_batch=GRAD_BATCH, in_dim=8, hidden=16, out_dim=3)


def _flat_grad(model, loss_fn, batch, world: int, rank: int) -> torch.Tensor:
    """The unit's flat gradient (every trainable parameter, padded) of the loss on `batch`."""
    x, y = batch
    loss_fn(model(x), y).backward()
    params = [p for p in model.parameters() if p.requires_grad]
    return FlatShard(params, world, rank).flatten([p.grad for p in params])


def _reduce_rank(reduce_scatter_grad: Callable) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = _grad_fixture()
    local = _flat_grad(model, loss_fn, shard_batch(batches[0], rank, world), world, rank)
    with comm.record() as ledger:
        got = reduce_scatter_grad(local.clone())
    got = got.detach().clone() if isinstance(got, torch.Tensor) else got
    records = [(r.op, r.payload_bytes, r.ring_bytes) for r in ledger.records]
    return dict(got=got, local=local, records=records)


def _reference_flat(world: int) -> torch.Tensor:
    model, batches, loss_fn = _grad_fixture()
    return _flat_grad(model, loss_fn, batches[0], world, 0)


def _diagnose_reduce(res: dict, ref_flat: torch.Tensor, rank: int, world: int) -> str | None:
    got = res["got"]
    full = ref_flat.numel()
    c = full // world
    chunk = lambda t, r: t[r * c : (r + 1) * c]  # noqa: E731
    if not isinstance(got, torch.Tensor):
        return f"return this rank's chunk as a tensor; got {type(got).__name__}."
    if got.numel() == full:
        return (
            f"you returned {full} elements, the whole flat gradient: after the reduce-scatter "
            f"a rank keeps only its chunk of {full} / {world} = {c}, the gradient of the "
            "parameter elements it owns and steps."
        )
    if got.numel() != c:
        return f"the chunk has {got.numel()} elements; a rank's chunk has {full} / {world} = {c}."
    got = got.reshape(-1)
    want = chunk(ref_flat, rank)
    if not close(got, want):
        if close(got, chunk(res["local"], rank)):
            return (
                "the chunk is still this rank's own gradient: nothing was reduced. "
                "comm.reduce_scatter(chunk, flat_grad) sums over the ranks and leaves rank r's "
                "chunk of the sum."
            )
        if close(got, world * want):
            return (
                f"the chunk is {world}x too large: the reduce-scatter sums over the {world} "
                f"ranks; divide by N={world} (FSDP pre-divides the flat gradient, so the sum "
                "is the mean)."
            )
        if close(got, want / world):
            return (
                f"the chunk is {world}x too small: you divided by N={world} twice (before and "
                "after the reduce-scatter)."
            )
        for other in range(world):
            if other != rank and (
                close(got, chunk(ref_flat, other)) or close(got, world * chunk(ref_flat, other))
            ):
                return (
                    f"rank {rank} got the chunk of rank {other}: rank r owns elements "
                    f"[r·c, (r+1)·c) = [{rank * c}, {(rank + 1) * c}) here."
                )
        return (
            "the chunk differs from this rank's chunk of the mean gradient (not by a "
            "uniform factor): reduce-scatter the whole flat gradient, divided by N."
        )
    return None


def _diagnose_ledger(res: dict, full: int, world: int) -> str | None:
    """With the right values: was it one reduce-scatter?"""
    ops = [op for op, _, _ in res["records"]]
    if "all_reduce" in ops:
        sent = sum(b for op, _, b in res["records"])
        rs = comm.ring_bytes("reduce_scatter", 4 * full, world)
        return (
            f"the values are right but you all-reduced the whole flat gradient and kept a "
            f"slice: {sent:.0f} bytes sent by this rank, twice the {rs:.0f} of a reduce-scatter "
            "(2(N-1)/N·S against (N-1)/N·S), and for a moment every rank held the whole "
            "reduced gradient. comm.reduce_scatter(chunk, flat_grad) gives each rank only its "
            "chunk."
        )
    if ops != ["reduce_scatter"]:
        return (
            f"the ledger shows {ops}: a unit's gradient needs exactly one "
            "comm.reduce_scatter (use minidist.comm so it is recorded)."
        )
    return None


def check_reduce_scatter_grad(reduce_scatter_grad: Callable) -> None:
    """Reduce-scatter a unit's flat gradient on worlds of 2 and 4; name the mistake."""
    for world in WORLDS:
        ref_flat = _reference_flat(world)
        results = run_on_world(_reduce_rank, world, reduce_scatter_grad)
        for rank, res in enumerate(results):  # values first, on every rank, then the ledger
            problem = _diagnose_reduce(res, ref_flat, rank, world)
            if problem:
                fail(f"world of {world}, rank {rank}: {problem}")
        for rank, res in enumerate(results):
            problem = _diagnose_ledger(res, ref_flat.numel(), world)
            if problem:
                fail(f"world of {world}, rank {rank}: {problem}")
    n = _reference_flat(WORLDS[-1]).numel()
    passed(
        f"reduce_scatter_grad leaves each rank its chunk of the mean gradient with one "
        f"reduce-scatter ({n} padded elements; N={WORLDS})"
    )
