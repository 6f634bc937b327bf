"""data_parallel checker: exercise 1, average the gradients (naive DP)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from ... import comm
from ...course.check import close, diagnose_values, fail, grads, passed, run_on_world
from ...course.watch import watch_comm
from ...data import shard_batch
from ...runtime import RankFailedError
from ._shared import WORLDS, _fixture, _reference


def _average_rank(average_gradients: Callable[[nn.Module], None]) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = _fixture()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = []
    for batch in batches:
        x, y = shard_batch(batch, rank, world)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        local = grads(model)
        with comm.record() as ledger, watch_comm() as watch:
            average_gradients(model)
        steps.append(
            dict(local=local, got=grads(model), ops=ledger.ops(), unwaited=watch.never_waited())
        )
        opt.step()
    return dict(steps=steps)


def _diagnose_ops(results: list, step: int, ref: dict) -> str | None:
    """Mistakes the ledger names before the values do: async work never waited on, a reduce
    or a broadcast where every rank needs the sum."""
    steps = [res["steps"][step] for res in results]
    if any(s["unwaited"] for s in steps):
        return (
            f"{len(steps[0]['unwaited'])} async all-reduce(s) were never waited on: a "
            "gradient is only reduced after work.wait(); reading or dividing it before reads "
            "whatever has arrived so far. Keep the works and wait on each before dividing."
        )
    right = [all(close(s["got"][n], ref[n]) for n in ref if n in s["got"]) for s in steps]
    if all(right):
        return None
    ops = set(steps[0]["ops"])
    if "reduce" in ops and "all_reduce" not in ops:
        return (
            "comm.reduce sums onto one rank only (dst); the other ranks keep a partial or "
            f"their own gradient (right on ranks {[r for r, ok in enumerate(right) if ok]}). "
            "Every rank steps its own replica, so every rank needs the sum: comm.all_reduce."
        )
    if "broadcast" in ops and "all_reduce" not in ops:
        return (
            "comm.broadcast copies one rank's gradient to every rank; it does not sum. Every "
            "rank needs the mean of all ranks' gradients: comm.all_reduce, then divide by N."
        )
    return None


def check_average_gradients(average_gradients: Callable[[nn.Module], None]) -> None:
    """Run `average_gradients(model)` after backward on worlds of 2 and 4; name the mistake."""
    reference = _reference()
    n_trainable = len(reference[0])
    for world in WORLDS:
        try:
            results = run_on_world(_average_rank, world, average_gradients)
        except RankFailedError as exc:
            if "NoneType" in str(exc):
                fail(
                    "your code touched a gradient that is None: a frozen parameter "
                    "(requires_grad=False) has no gradient. Skip parameters whose grad is None."
                )
            raise
        for step, ref in enumerate(reference):
            problem = _diagnose_ops(results, step, ref)
            if problem:
                fail(f"world of {world}, step {step}: {problem}")
            for rank, res in enumerate(results):
                s = res["steps"][step]
                problem = diagnose_values(s["got"], ref, s["local"], world)
                if problem:
                    fail(f"world of {world}, step {step}, rank {rank}: {problem}")
        ops = results[0]["steps"][0]["ops"]
        if ops.count("all_reduce") != n_trainable:
            fail(
                f"the gradients are right but the ledger shows {len(ops)} minidist "
                f"collectives ({ops}); naive DP makes one comm.all_reduce per parameter "
                f"with a gradient ({n_trainable} here). Use minidist.comm so it is recorded."
            )
    passed(
        "average_gradients matches one process on the concatenated batch for "
        f"N={tuple(sorted(WORLDS))} "
        f"({n_trainable} all-reduces per step, frozen parameter skipped)"
    )
