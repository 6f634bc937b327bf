"""mixed_precision checker: exercise 3: a mean in fp16."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist

from ... import comm
from ...course.check import fail, passed, run_on_world
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


def _families(world: int, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    """What each wrong split of the division gives on the exact (double) inputs."""
    pre, post = divide_factors(world)
    total = inputs.sum(0)
    return {
        "no_divide": total,
        "twice": total / world**2,
        "n_minus_1": total / (world - 1),
        "pre_twice": total / pre**2,
        "post_twice": total / post**2,
        "max": inputs.max(0).values / world,
        "min": inputs.min(0).values / world,
        "own": None,  # this rank's own gradient, filled in per rank
    }


_FAMILY_WORDS = {
    "no_divide": "you forgot to divide: the all-reduce sums, and pre · post must be N",
    "twice": "you divided by N twice (pre · post = N², not N)",
    "n_minus_1": "you divided by N - 1 in all, not by N: pre · post must be N",
    "pre_twice": "you divided by pre before and by pre again after: post = N / pre",
    "post_twice": "you divided by post before and by post again after: pre = N / post",
    "max": "the all-reduce took the maximum (ReduceOp.MAX): the mean needs the SUM",
    "min": "the all-reduce took the minimum (ReduceOp.MIN): the mean needs the SUM",
    "own": "nothing was all-reduced: each rank returned its own gradient divided by N",
}


def _family(results: dict[int, list[dict]]) -> str | None:
    """The wrong split that explains every rank's ordinary element on every world, if any."""
    for name in _FAMILY_WORDS:
        fits, shown = True, []
        for world, res in results.items():
            inputs = torch.stack([fp16_input(r).double() for r in range(world)])
            for rank, r in enumerate(res):
                want = _families(world, inputs)[name]
                want = inputs[rank] / world if want is None else want
                got = r["out"].double()[2]
                fits &= bool(torch.isclose(got, want[2], rtol=2e-3, atol=0))
            shown.append(f"{world} ranks: {float(res[0]['out'][2]):g}")
        if fits:
            mean = {w: (w + 1) / 2 for w in results}
            return (
                f"the ordinary element (r + 1 on rank r, mean {mean}) came out "
                f"{'; '.join(shown)}: {_FAMILY_WORDS[name]}."
            )
    return None


def check_fp16_mean(mean_in_fp16: Callable) -> None:
    """Run `mean_in_fp16(grad) -> mean over ranks` on worlds of 2 and 4."""
    fp16 = theory.float_format(torch.float16)
    results = {
        world: run_on_world(_fp16_rank, world, mean_in_fp16, hang_hint=FP16_HANG_HINT)
        for world in FP16_WORLDS
    }
    for world, res in results.items():
        for rank, r in enumerate(res):
            got = r["out"]
            if got is None or got.shape != (3,):
                shape = tuple(got.shape) if got is not None else r["kind"]
                fail(
                    f"on {world} ranks, rank {rank}: returned {shape}; return the mean, a "
                    "tensor shaped like grad."
                )
            other = [(op, dtype) for op, _, dtype in r["records"] if dtype != torch.float16]
            if other:
                payload = sum(b for _, b, _ in r["records"])
                fail(
                    f"on {world} ranks, rank {rank}: the ledger shows {other} ({payload} bytes): "
                    f"the reduction ran in another dtype than fp16. This exercise is the fp16 "
                    f"reduction (2 bytes an element, half of fp32's; bf16 keeps only 8 "
                    f"significant bits): keep grad in fp16 and split the division so that it "
                    f"stays in range."
                )
    family = _family(results)
    if family:
        fail(family)
    for world, res in results.items():
        inputs = torch.stack([fp16_input(r).double() for r in range(world)])
        want, total = inputs.mean(0), inputs.sum(0)
        pre, post = divide_factors(world)
        for rank, r in enumerate(res):
            where = f"on {world} ranks, rank {rank}"
            got = r["out"].double()
            if torch.isinf(got[0]):
                fail(
                    f"{where}: the large element came out inf: the ranks' values "
                    f"{inputs[:, 0].tolist()} add up to {total[0]:g}, beyond fp16's max "
                    f"{fp16.max:g} (ReduceOp.AVG too sums before it divides). Divide by part "
                    f"of N before the all-reduce (pre-divide) and by the rest after: "
                    f"divide_factors({world}) = ({pre:g}, {post:g})."
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
    for world, res in results.items():
        inputs = torch.stack([fp16_input(r).double() for r in range(world)])
        want = inputs.mean(0)
        pre, post = divide_factors(world)
        for rank, r in enumerate(res):
            where = f"on {world} ranks, rank {rank}"
            got = r["out"].double()
            if not torch.allclose(got, want, rtol=2e-3, atol=0) or got[1] != want[1]:
                if torch.allclose(got[::2], want[::2], rtol=2e-3, atol=0):
                    fail(
                        f"{where}: the small element came out {got[1]:.3g} where the mean is "
                        f"exactly {want[1]:.3g} (2^-23): a factor that is not a power of two "
                        f"(√N = {math.sqrt(world):.4g}?) rounds every division in fp16, and "
                        f"near the smallest subnormal 2^-24 that rounding is large. Use "
                        f"powers of two, whose divisions are exact: divide_factors({world}) = "
                        f"({pre:g}, {post:g})."
                    )
                bad = int((~torch.isclose(got, want, rtol=2e-3, atol=0)).nonzero()[0])
                fail(
                    f"{where}: element {bad} came out {got[bad]:.6g}, the mean over ranks is "
                    f"{want[bad]:.6g} ({float(got[bad] / want[bad]):.4g}x it); the whole "
                    f"result: {got.tolist()}. Pre-divide by pre, all-reduce (SUM), post-divide "
                    f"by post, pre · post = N: divide_factors({world}) = ({pre:g}, {post:g})."
                )
            if r["out"].dtype != torch.float16:
                fail(
                    f"{where}: the values are right, but the result is {r['out'].dtype}: "
                    f"return the mean in fp16, like grad (divide the fp16 sum by post; do not "
                    f"cast it)."
                )
            if not r["records"]:
                fail(
                    f"{where}: the values are right but no collective went through "
                    "minidist.comm: call comm.all_reduce so that the ledger sees it."
                )
            ops = [(op, dtype) for op, _, dtype in r["records"]]
            if len(ops) != 1:
                fail(f"{where}: the ledger shows {ops}: one all-reduce is enough.")
    passed(
        f"mean_in_fp16 reduces in fp16 on {_and(FP16_WORLDS)} ranks without overflow or "
        f"underflow: on 4 ranks the sum of 30000 + 28000 + 26000 + 24000 stays below "
        f"{fp16.max:g} and 2^-23 stays above zero with pre = post = 2"
    )
