"""fsdp checker: exercise 3: reduce-scatter the flat gradient."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from ... import comm
from ...course.check import close, fail, passed, run_on_world, where_differs
from ...course.watch import watch_comm
from ...data import shard_batch
from ...data_parallel.fixture import build
from ...zero.flat import FlatShard

GRAD_BATCH = 12
GRAD_WORLDS = (3, 2, 4)  # 3 first: there N, N-1 and 1/N are three different mistakes


def _grad_fixture():
    """Lesson 01's MLP, smaller, with a 3-wide output: 451 trainable elements, 1 of padding
    on 2 and 4 ranks, 2 on 3; the frozen first bias is outside the unit."""
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
    with comm.record() as ledger, watch_comm() as watch:
        got = reduce_scatter_grad(local.clone())
    got = got.detach().clone() if isinstance(got, torch.Tensor) else got
    records = [(r.op, r.payload_bytes, r.ring_bytes) for r in ledger.records]
    return dict(got=got, local=local, records=records, never_waited=watch.never_waited())


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
    if res.get("never_waited") and not close(got.reshape(-1), chunk(ref_flat, rank)):
        return (
            f"the async {res['never_waited'][0]} was never waited on, and the chunk was read "
            "before it was complete: call work.wait() before using its output."
        )
    got = got.reshape(-1)
    want = chunk(ref_flat, rank)
    if not close(got, want):
        if close(got, chunk(res["local"], rank)):
            return (
                "the chunk is still this rank's own gradient: nothing was reduced. "
                "comm.reduce_scatter(chunk, flat_grad) sums over the ranks and leaves rank r's "
                "chunk of the sum."
            )
        if world > 2 and close(got, world / (world - 1) * want):
            return (
                f"the chunk is {world}/{world - 1} of the mean: you divided the sum over "
                f"{world} ranks by N-1 = {world - 1}; divide by the world size N = {world}."
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
            "the chunk differs from this rank's chunk of the mean gradient, not by a "
            f"uniform factor ({where_differs(got, want)}): reduce-scatter the whole flat "
            "gradient, divided by N."
        )
    return None


def _diagnose_ledger(res: dict, full: int, world: int) -> str | None:
    """With the right values: was it one reduce-scatter?"""
    ops = [op for op, _, _ in res["records"]]
    if res.get("never_waited"):
        return (
            f"the values happen to be right, but the async {res['never_waited'][0]} was never "
            "waited on: its output is only complete after work.wait(), and reading it before "
            "reads whatever has arrived so far. Wait on the work before returning the chunk "
            "(or make the call blocking)."
        )
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
    for world in GRAD_WORLDS:
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
    n = _reference_flat(GRAD_WORLDS[-1]).numel()
    passed(
        f"reduce_scatter_grad leaves each rank its chunk of the mean gradient with one "
        f"reduce-scatter ({n} padded elements; N={tuple(sorted(GRAD_WORLDS))})"
    )
