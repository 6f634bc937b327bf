"""fsdp checker: exercise 2: unshard and reshard."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from ... import comm
from ...course.check import close, fail, passed, run_on_world
from ...course.watch import watch_comm
from ...runtime import RankFailedError
from ...zero.flat import FlatShard
from ._shared import WORLDS
from .flatten import _numel

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
    layout = FlatShard([torch.empty(s, device="cpu") for s in UNSHARD_SHAPES], world, rank)
    flat = torch.zeros(layout.padded, device="cpu")
    flat[: layout.numel] = torch.arange(1, layout.numel + 1, dtype=torch.float32, device="cpu")
    chunk = layout.own(flat).clone()
    full = torch.empty(layout.padded, device="cpu")
    full.untyped_storage().resize_(0)  # freed, as between two uses of the unit
    shapes = [torch.Size(s) for s in UNSHARD_SHAPES]
    out: dict = dict(padded=layout.padded, numel=layout.numel, offsets=layout.offsets)
    with comm.record() as ledger, watch_comm() as watch:
        views = list(unshard(full, chunk, list(layout.offsets), shapes))
    out["ops"] = [(r.op, r.payload_bytes) for r in ledger.records]
    out["temporary"] = _storage_bytes(full) > 0 and watch.wrote_outside("all_gather", full)
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
    if res.get("temporary"):
        return (
            f"you all-gathered into a temporary full-size buffer ({padded_bytes} bytes) and "
            "copied it into `full`: for that moment the rank holds the whole flat parameter "
            "twice, the memory FSDP shards to save. Gather into `full` itself: "
            "comm.all_gather(full, chunk) after re-allocating its storage."
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
    flat = torch.arange(1, res["numel"] + 1, dtype=torch.float32, device="cpu")
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
