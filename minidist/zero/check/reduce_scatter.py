"""zero checker: exercise 2: reduce-scatter a gradient bucket."""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
import torch.distributed as dist

from ... import comm
from ...course.check import best_scale, close, fail, passed, run_on_world, where_differs
from ...course.watch import watch_comm
from ...runtime import RankFailedError
from .. import theory
from ._shared import _and

BUCKET_NUMEL = 12  # a padded bucket: divisible by 2, 3 and 4
RS_WORLDS = (3, 2, 4)  # 3 first: there N, N-1 and 1/N are three different mistakes
RS_HANG_HINT = (
    "Every rank must call comm.reduce_scatter once, with the same input size (the whole "
    "bucket) and an output of 1/N of it."
)


def _grad_input(rank: int, numel: int) -> torch.Tensor:
    """Rank r, element i: (i + 1) + 100·2^r. Sums over different sets of ranks all differ."""
    return torch.arange(1, numel + 1, dtype=torch.float32, device="cpu") + 100.0 * 2**rank


def _rs_rank(fn: Callable, numel: int) -> dict:
    rank = dist.get_rank()
    with comm.record() as ledger, watch_comm() as watch:
        out = fn(_grad_input(rank, numel))
    out = out.detach().clone() if isinstance(out, torch.Tensor) else type(out).__name__
    return dict(
        out=out,
        records=[(r.op, r.ring_bytes) for r in ledger.records],
        unwaited=watch.never_waited(),
    )


def _mean_grad(world: int, numel: int) -> torch.Tensor:
    return torch.stack([_grad_input(r, numel) for r in range(world)]).mean(0)


def _diagnose_chunk_values(
    got: torch.Tensor, mean: torch.Tensor, local: torch.Tensor, rank: int, world: int
) -> str | None:
    """What is wrong with rank `rank`'s reduced chunk `got`; `mean` and `local` are the whole
    mean and this rank's whole input. None when it is right."""
    chunk = mean.numel() // world
    want = mean[rank * chunk : (rank + 1) * chunk]
    if close(got, want):
        return None
    if close(got, local[rank * chunk : (rank + 1) * chunk]):
        return (
            f"rank {rank}'s chunk still holds its own gradient: nothing was reduced over the "
            "ranks. comm.reduce_scatter(out, flat_grad) sums chunk r of every rank's input "
            "into rank r's `out`."
        )
    scale = best_scale(got, want)
    if close(got, want * world):
        return (
            f"the chunk is {world}x the mean: reduce-scatter sums over the {world} ranks; you "
            f"forgot to divide by the world size N={world}."
        )
    if world > 2 and close(got, want * world / (world - 1)):
        return (
            f"the chunk is {world}/{world - 1} of the mean: you divided the sum over {world} "
            f"ranks by N-1 = {world - 1}; divide by the world size N = {world}."
        )
    if close(got, want / world):
        return (
            f"the chunk is {world}x too small: you divided by N={world} twice (before the "
            "reduce-scatter and after it): divide once."
        )
    for j in range(world):
        other = mean[j * chunk : (j + 1) * chunk]
        for factor, how in ((1, ""), (world, f", {world}x too large")):
            if j != rank and close(got, other * factor):
                return (
                    f"rank {rank} holds chunk {j}'s mean{how}: rank r keeps chunk r, elements "
                    f"[r·{chunk}, (r+1)·{chunk}) of the bucket, which is what "
                    "comm.reduce_scatter puts in rank r's output."
                )
    return (
        f"rank {rank}'s chunk is not the mean over ranks of chunk {rank} (best fit {scale:.3g}x "
        f"it; {where_differs(got, want)})."
    )


def check_reduce_scatter_bucket(reduce_scatter_bucket: Callable) -> None:
    """Run `reduce_scatter_bucket(flat_grad) -> chunk` on worlds of 2, 3 and 4."""
    for world in RS_WORLDS:
        try:
            results = run_on_world(
                _rs_rank, world, reduce_scatter_bucket, BUCKET_NUMEL, hang_hint=RS_HANG_HINT
            )
        except RankFailedError as exc:
            if "outputShape" in str(exc) or "output tensor size" in str(exc).lower():
                where = re.search(r" in (`[^`]+` \([^)]*\)(: `[^`]*`)?)", str(exc))
                fail(
                    f"comm.reduce_scatter(output, input) aborted on {world} ranks"
                    + (f" in {where.group(1)}" if where else "")
                    + ": the sizes do not fit. The input is the whole bucket, flat_grad "
                    f"({BUCKET_NUMEL} elements), and the output 1/N of it, {BUCKET_NUMEL} // "
                    f"{world} = {BUCKET_NUMEL // world} elements (torch.empty(flat_grad.numel() "
                    "// N)): the output must hold 1/N of its input."
                )
            raise
        unwaited = [r for r, res in enumerate(results) if res.get("unwaited")]
        if unwaited:
            fail(
                f"on {world} ranks, ranks {unwaited} launched an async reduce-scatter "
                "(async_op=True) and never waited on its work: the output is only complete "
                "after work.wait(). Wait before returning (or call it without async_op)."
            )
        mean = _mean_grad(world, BUCKET_NUMEL)
        chunk = BUCKET_NUMEL // world
        full = 4 * BUCKET_NUMEL
        half = theory.bytes_sent_per_step(BUCKET_NUMEL, world, stage=0) / 2
        for rank, res in enumerate(results):
            ops = [op for op, _ in res["records"]]
            sent = sum(b for _, b in res["records"])
            where = f"on {world} ranks"
            all_reduce = (
                f"An all-reduce gives every rank the sum of the whole bucket and sends "
                f"2(N-1)/N·S = {2 * half:.0f} bytes per rank for S = {full} bytes, twice the "
                f"reduce-scatter's (N-1)/N·S = {half:.0f}; rank r only needs chunk r: use "
                "comm.reduce_scatter."
            )
            if not isinstance(res["out"], torch.Tensor):
                fail(f"{where} rank {rank} returned a {res['out']}; return the reduced chunk.")
            out = res["out"].reshape(-1)
            if out.numel() == BUCKET_NUMEL:
                fail(
                    f"{where} rank {rank} returned the whole bucket ({BUCKET_NUMEL} elements): "
                    f"return only its chunk, the {chunk} elements reduce-scatter leaves on it."
                    + (f" {all_reduce}" if "all_reduce" in ops else "")
                )
            if out.numel() != chunk:
                fail(f"{where} rank {rank} returned {out.numel()} elements; its chunk has {chunk}.")
            local = _grad_input(rank, BUCKET_NUMEL)
            problem = _diagnose_chunk_values(out, mean, local, rank, world)
            if problem:
                fail(f"{where}: {problem}")
            if "all_reduce" in ops:
                fail(f"{where} the chunk is right but the ledger shows {ops}. {all_reduce}")
            if "reduce_scatter" not in ops:
                fail(
                    f"{where} the chunk is right but no reduce-scatter went through "
                    f"minidist.comm (the ledger shows {ops}): call comm.reduce_scatter(out, "
                    "flat_grad) so that the ledger sees it."
                )
            if sent != half:
                fail(
                    f"{where} rank {rank} sent {sent:.0f} bytes ({ops}); one reduce-scatter of "
                    f"the {full}-byte bucket sends (N-1)/N·S = {half:.0f}: call it once."
                )
    passed(
        "reduce_scatter_bucket leaves on rank r the mean of chunk r for "
        f"N = {_and(sorted(RS_WORLDS))}, "
        "with one reduce-scatter: (N-1)/N·S bytes sent, half an all-reduce"
    )
