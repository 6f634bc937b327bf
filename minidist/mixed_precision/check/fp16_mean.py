"""mixed_precision checker: exercise 3: a mean in fp16."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist

from ... import comm
from ...course.check import best_scale, fail, passed, run_on_world
from .. import theory
from ..policy import divide_factors
from ._shared import _and

FP16_WORLDS = (2, 4)
FP16_HANG_HINT = "Every rank must call comm.all_reduce once, on a tensor of the same size."
TINY = 2.0**-23


def fp16_input(rank: int) -> torch.Tensor:
    """Rank r's fp16 gradient: a large value, a tiny one and an ordinary one."""
    return torch.tensor(
        [30000.0 - 2000.0 * rank, TINY, rank + 1.0], dtype=torch.float16, device="cpu"
    )


def _fp16_rank(fn: Callable) -> dict:
    grad = fp16_input(dist.get_rank())
    with comm.record() as ledger:
        out = fn(grad.clone())
    kind = type(out).__name__
    out = out.detach().clone() if isinstance(out, torch.Tensor) else None
    return dict(
        out=out, kind=kind, records=[(r.op, r.payload_bytes, r.dtype) for r in ledger.records]
    )


def check_fp16_mean(mean_in_fp16: Callable) -> None:
    """Run `mean_in_fp16(grad) -> mean over ranks` on worlds of 2 and 4."""
    fp16 = theory.float_format(torch.float16)
    for world in FP16_WORLDS:
        results = run_on_world(_fp16_rank, world, mean_in_fp16, hang_hint=FP16_HANG_HINT)
        inputs = torch.stack([fp16_input(r).double() for r in range(world)])
        want, total = inputs.mean(0), inputs.sum(0)
        pre, post = divide_factors(world)
        for rank, res in enumerate(results):
            where = f"on {world} ranks, rank {rank}"
            got = res["out"]
            if got is None or got.shape != want.shape:
                shape = tuple(got.shape) if got is not None else res["kind"]
                fail(f"{where}: returned {shape}; return the mean, a tensor shaped like grad.")
            got = got.double()
            if torch.isinf(got[0]):
                fail(
                    f"{where}: the large element came out inf: the ranks' values "
                    f"{inputs[:, 0].tolist()} add up to {total[0]:g}, beyond fp16's max "
                    f"{fp16.max:g}. Divide by part of N before the all-reduce (pre-divide) "
                    f"and by the rest after: divide_factors({world}) = ({pre:g}, {post:g})."
                )
            if got[1] == 0 and want[1] > 0:
                fail(
                    f"{where}: the small element came out 0 where the mean is {want[1]:.3g} "
                    f"(2^-23): divided by all of N={world} before the all-reduce, 2^-23 / "
                    f"{world} = 2^{math.log2(TINY / world):g} is no more than half of fp16's "
                    f"smallest subnormal 2^-24 and rounds to zero on every rank. Pre-divide by "
                    f"part of N "
                    f"only, post-divide by the rest: divide_factors({world}) = ({pre:g}, "
                    f"{post:g})."
                )
            if not torch.allclose(got, want, rtol=2e-3, atol=0):
                c = best_scale(got, want)
                if abs(c - world) < 1e-2 * world:
                    fail(
                        f"{where}: the result is {world}x the mean: the all-reduce sums; divide "
                        f"by N={world} in all (pre · post = N)."
                    )
                if abs(c * world - 1) < 1e-2:
                    fail(
                        f"{where}: the result is {world}x too small: you divided by N={world} "
                        "twice. pre · post must be N, not N²."
                    )
                fail(
                    f"{where}: got {got.tolist()}, the mean over ranks is {want.tolist()} "
                    f"({c:.3g}x it): pre-divide, all-reduce (SUM), post-divide, pre · post = N."
                )
            ops = [(op, dtype) for op, _, dtype in res["records"]]
            if not ops:
                fail(
                    f"{where}: the values are right but no collective went through "
                    "minidist.comm: call comm.all_reduce so that the ledger sees it."
                )
            if any(dtype != torch.float16 for _, dtype in ops):
                payload = sum(b for _, b, _ in res["records"])
                fail(
                    f"{where}: the values are right, but the ledger shows {ops} ({payload} "
                    f"bytes): the reduction ran in another dtype than fp16. This exercise is "
                    f"the fp16 reduction (2 bytes an element, half of fp32's): keep grad in "
                    f"fp16 and split the division so that it stays in range."
                )
            if len(ops) != 1:
                fail(f"{where}: the ledger shows {ops}: one all-reduce is enough.")
    passed(
        f"mean_in_fp16 reduces in fp16 on {_and(FP16_WORLDS)} ranks without overflow or "
        f"underflow: on 4 ranks the sum of 30000 + 28000 + 26000 + 24000 stays below "
        f"{fp16.max:g} and 2^-23 stays above zero with pre = post = 2"
    )
