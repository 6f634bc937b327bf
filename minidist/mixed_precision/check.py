"""Checkers for the mixed-precision exercises of lesson 04.

Micikevicius et al. 2018, "Mixed Precision Training" (ICLR), section 3.2 (loss scaling);
`torch.amp.GradScaler` (the dynamic rule); PyTorch FSDP's pre/post gradient divide factors.

1. `check_loss_scaler(LossScaler)`: in one process, `LossScaler(init_scale, growth_factor,
   backoff_factor, growth_interval)` with `scale(loss)` and `get_scale()` given, and the
   learner's `step(optimizer)` (unscale every gradient, step unless one is inf or NaN,
   return whether it stepped) and `update()` (halve the scale after an overflow and reset
   the count of good steps; double it after `growth_interval` good steps in a row and reset
   the count). SGD on one parameter for 18 steps, overflows injected (inf at steps 2, 6, 7,
   a NaN at step 11), compared with `torch.amp.GradScaler`'s scales and with the parameters
   a right scaler gives. Named: grows after every good step, no reset of the count on an
   overflow or after growing, halves without skipping, skips without halving, NaN missed,
   gradients not unscaled (or divided twice).
2. `check_found_inf_agreement(found_inf_on_any_rank)`: on worlds of 2 and 3, lesson 03's FSDP
   trains the MLP; after backward each rank holds the gradient of its own shards, and the
   checker puts an inf (step 1, last rank only), a NaN (step 3, rank 0 only) and an inf on
   every rank (step 4). `found_inf_on_any_rank(grads)` must return the same answer on every
   rank, True when any rank's gradients hold an inf or NaN; the step is skipped where it
   says so. The same run with a right answer is the reference. Named: not all-reduced (one
   rank skips, another steps: their shards go out of step, shown), MIN instead of MAX, NaN
   missed, no collective through `minidist.comm`, the gradients all-reduced instead of one
   flag, gradients changed.
3. `check_fp16_mean(mean_in_fp16)`: on worlds of 2 and 4, `mean_in_fp16(grad)` returns the
   mean over ranks of an fp16 gradient with one all-reduce *in fp16*, dividing by N partly
   before (pre) and partly after (post). Rank r's gradient holds 30000 - 2000·r (their sum
   passes fp16's max 65504 on 4 ranks), 2^-23 (a quarter of it is below fp16's smallest
   subnormal) and r + 1. Named: the sum overflowed (all divided after), the small values
   underflowed (all divided before), forgot to divide, divided twice, reduced in fp32.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import comm
from ..course.check import best_scale, fail, passed, run_on_world
from ..data import shard_batch
from ..data_parallel.fixture import build
from ..fsdp.fixture import UNITS
from ..fsdp.fully_sharded import FullyShardedDataParallel
from . import theory
from .fixture import grad_scaler_scales
from .policy import divide_factors

INF, NAN = float("inf"), float("nan")


def _and(worlds) -> str:
    """(2, 3, 4) -> "2, 3 and 4"."""
    names = [str(w) for w in worlds]
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]


# -- exercise 1: the loss scaler's rule --------------------------------------------------------

SCALER_ARGS = dict(init_scale=2.0**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
SCALER_STEPS = 18
# Chosen so that every wrong rule below gives another sequence: a growth right before an
# overflow (5, 6), two overflows in a row (6, 7), a NaN alone (11), and six good steps after
# it (two growths in a row at 14 and 17).
OVERFLOWS = {2: INF, 6: INF, 7: INF, 11: NAN}
LR = 0.01
START = (1.0, -2.0, 3.0, 0.5)
COEF = (0.5, 1.0, -1.0, 2.0)  # the gradient of the loss (p · COEF).sum()


def _drive_scaler(cls: type) -> list[dict]:
    scaler = cls(**SCALER_ARGS)
    p = nn.Parameter(torch.tensor(START))
    opt = torch.optim.SGD([p], lr=LR)
    out = []
    for step in range(SCALER_STEPS):
        opt.zero_grad()
        scaler.scale((p * torch.tensor(COEF)).sum()).backward()
        if step in OVERFLOWS:
            p.grad[0] = OVERFLOWS[step]
        stepped = scaler.step(opt)
        scaler.update()
        out.append(dict(stepped=stepped, scale=float(scaler.get_scale()), p=p.detach().clone()))
    return out


def _right_params() -> list[torch.Tensor]:
    p, out = torch.tensor(START), []
    for step in range(SCALER_STEPS):
        if step not in OVERFLOWS:
            p = p - LR * torch.tensor(COEF)
        out.append(p.clone())
    return out


def simulate_scales(rule: str = "right") -> list[float]:
    """The scales after each step under `rule`: "right" (GradScaler's), or a known mistake:
    "every_good_step", "no_reset_on_overflow", "no_reset_after_growth" (the count compared
    with ==, so it never grows again), "no_reset_after_growth_ge" (with >=), "no_backoff"."""
    scale, good = SCALER_ARGS["init_scale"], 0
    interval = SCALER_ARGS["growth_interval"]
    out = []
    for step in range(SCALER_STEPS):
        if step in OVERFLOWS:
            if rule != "no_backoff":
                scale *= SCALER_ARGS["backoff_factor"]
            if rule != "no_reset_on_overflow":
                good = 0
        else:
            good += 1
            if rule == "every_good_step":
                scale *= SCALER_ARGS["growth_factor"]
            elif rule == "no_reset_after_growth_ge" and good >= interval:
                scale *= SCALER_ARGS["growth_factor"]
            elif good == interval:
                scale *= SCALER_ARGS["growth_factor"]
                if rule != "no_reset_after_growth":
                    good = 0
        out.append(scale)
    return out


def _fmt_scales(scales: list[float], upto: int) -> str:
    return (
        "[" + ", ".join(f"2^{math.log2(s):g}" if s > 0 else f"{s:g}" for s in scales[:upto]) + "]"
    )


def _scale_mistake(got: list[float], right: list[float]) -> str:
    first = next(i for i, (a, b) in enumerate(zip(got, right)) if a != b)
    seq = f"your scales after steps 0-{first}: {_fmt_scales(got, first + 1)}, GradScaler's: "
    seq += _fmt_scales(right, first + 1)
    interval = SCALER_ARGS["growth_interval"]
    if got == simulate_scales("every_good_step"):
        return (
            f"the scale doubled after step 0, a single good step ({seq}): it grows only after "
            f"growth_interval = {interval} good steps in a row. Count them in self.good_steps "
            "and double when the count reaches growth_interval."
        )
    if got == simulate_scales("no_reset_on_overflow"):
        return (
            f"the scale grew after step {first}, only {first - 2} good step(s) after the "
            f"overflow at step 2 ({seq}): an overflow restarts the count of good steps in a "
            f"row at 0 (GradScaler resets its growth tracker), so growth waits for "
            f"{interval} good steps after it."
        )
    if got == simulate_scales("no_reset_after_growth"):
        return (
            f"after growing at step 14 the scale never grew again, though steps 15-17 were "
            f"good ({seq}): when the scale grows, reset self.good_steps to 0, so that the next "
            f"growth comes {interval} good steps later."
        )
    if got == simulate_scales("no_reset_after_growth_ge"):
        return (
            f"after growing, the scale grew again after the very next good step ({seq}): "
            "reset self.good_steps to 0 when the scale grows."
        )
    if got == simulate_scales("no_backoff"):
        return (
            f"the overflow at step 2 was skipped but the scale stayed 2^{math.log2(got[2]):g} "
            f"({seq}): multiply it by backoff_factor = 0.5 after an overflow, or the next "
            "step overflows again."
        )
    return (
        f"{seq}. The rule: after an overflow multiply the scale by backoff_factor and set the "
        f"count of good steps to 0; after a good step add 1 to the count, and when it reaches "
        f"growth_interval = {interval} multiply the scale by growth_factor and set it to 0."
    )


def check_loss_scaler(scaler_cls: type) -> None:
    """Train one parameter with SGD and `scaler_cls` for 18 steps, overflows injected."""
    got = _drive_scaler(scaler_cls)
    right = grad_scaler_scales(SCALER_STEPS, tuple(OVERFLOWS), **SCALER_ARGS)
    params = _right_params()
    scales = [g["scale"] for g in got]
    for step, (g, want) in enumerate(zip(got, params)):
        if not isinstance(g["stepped"], bool):
            fail(
                f"step() returned {g['stepped']!r} at step {step}: return True when it stepped "
                "the optimizer and False when it skipped the step."
            )
        overflow = step in OVERFLOWS
        what = "a NaN" if overflow and math.isnan(OVERFLOWS[step]) else "an inf"
        if overflow and g["stepped"]:
            if what == "a NaN" and not any(got[s]["stepped"] for s in OVERFLOWS if s != step):
                fail(
                    f"step {step}'s gradient held a NaN and step() stepped on it: torch.isinf "
                    "finds inf but not NaN (nor does a comparison with float('inf')). Test "
                    "~torch.isfinite(grad): an overflow shows as inf or as NaN (inf - inf)."
                )
            halved = scales[step] == right[step]
            fail(
                f"step {step}'s gradient held {what}: "
                + ("the scale was halved, but " if halved else "")
                + f"the optimizer still stepped, and the parameter now holds {g['p'].tolist()}. "
                "An overflowed step must be skipped: call optimizer.step() only when every "
                "unscaled gradient is finite, and return False."
            )
        if not overflow and not g["stepped"]:
            fail(
                f"step {step} was skipped though every gradient was finite: skip only when a "
                "gradient holds inf or NaN (after dividing it by the scale)."
            )
        if not torch.allclose(g["p"], want, rtol=1e-5, atol=1e-6):
            before = got[step - 1]["p"] if step else torch.tensor(START)
            moved = g["p"] - before
            expected = -LR * torch.tensor(COEF)
            c = best_scale(moved, expected)
            used = scales[step - 1] if step else SCALER_ARGS["init_scale"]
            if abs(c - used) < 1e-3 * used:
                fail(
                    f"at step {step} the parameter moved {c:g}x as far as one SGD step with the "
                    f"true gradient: {c:g} is the loss scale. The gradients still carry the "
                    "scale: divide every gradient by it (unscale) before optimizer.step()."
                )
            if abs(c * used - 1) < 1e-3:
                fail(
                    f"at step {step} the parameter moved 1/{used:g} of one SGD step: the "
                    "gradients were divided by the scale twice. Unscale once."
                )
            fail(
                f"after step {step} the parameter is {g['p'].tolist()}, but one SGD step with "
                f"the unscaled gradient gives {want.tolist()} (moved {c:.3g}x as far)."
            )
    if scales != right:
        fail(_scale_mistake(scales, right))
    passed(
        f"LossScaler follows torch.amp.GradScaler for {SCALER_STEPS} steps (growth every "
        f"{SCALER_ARGS['growth_interval']} good steps, overflows at steps {sorted(OVERFLOWS)}; "
        f"scales after steps 0-7: {_fmt_scales(scales, 8)}), and skipped steps leave the "
        "parameter alone"
    )


# -- exercise 2: every rank agrees on found-inf ------------------------------------------------

AGREE_WORLDS = (2, 3)
AGREE_STEPS = 6
# step -> (which ranks, the value put in their first shard's gradient)
INJECT = {1: ("last", INF), 3: ("first", NAN), 4: ("all", INF)}
AGREE_HANG_HINT = (
    "Every rank must make the same collective at every step, whether or not its own "
    "gradients hold an inf: call the all-reduce unconditionally."
)


def _injected_ranks(step: int, world: int) -> set[int]:
    which = INJECT.get(step, (None,))[0]
    return {"last": {world - 1}, "first": {0}, "all": set(range(world)), None: set()}[which]


def right_found_inf(grads: list[torch.Tensor]) -> bool:
    """The answer: a 0/1 flag per rank, all-reduced with MAX (what `DynamicLossScaler` does)."""
    found = torch.zeros(())
    for g in grads:
        found = torch.maximum(found, (~torch.isfinite(g)).any().float())
    comm.all_reduce(found, op=comm.ReduceOp.MAX)
    return bool(found)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def _agree_run(fn: Callable) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build("mlp", steps=AGREE_STEPS, global_batch=12)
    fsdp = FullyShardedDataParallel(model, wrap=UNITS["mlp"])
    shards = fsdp.sharded_parameters()
    opt = torch.optim.Adam(shards, lr=1e-2)
    steps = []
    for step, batch in enumerate(batches):
        x, y = shard_batch(batch, rank, world)
        opt.zero_grad()
        loss_fn(fsdp(x), y).backward()
        grads = [p.grad for p in shards]
        if rank in _injected_ranks(step, world):
            grads[0][0] = INJECT[step][1]
        local = any(bool((~torch.isfinite(g)).any()) for g in grads)
        grad_bytes = sum(g.numel() * g.element_size() for g in grads)
        before = [g.clone() for g in grads]
        with comm.record() as ledger:
            found = fn(grads)
        kind = type(found).__name__
        try:
            found = bool(found)
        except (RuntimeError, TypeError, ValueError):
            found = None
        if found is False:
            opt.step()
        steps.append(
            dict(
                found=found, kind=kind, local=local, grad_bytes=grad_bytes,
                mutated=not all(_same(a, b) for a, b in zip(before, grads)),
                records=[(r.op, r.payload_bytes, r.ring_bytes) for r in ledger.records],
                adam_steps=[int(s["step"]) for s in opt.state.values()],
                shards=[p.detach().clone() for p in shards],
            )
        )  # fmt: skip
    return dict(steps=steps, params=fsdp.full_parameters())


def _agree_rank(fn: Callable) -> tuple[dict, dict]:
    """The same training twice on this rank: with the right agreement, then with `fn`."""
    return _agree_run(right_found_inf), _agree_run(fn)


def _rank_list(ranks: list[int]) -> str:
    return ("ranks " if len(ranks) > 1 else "rank ") + ", ".join(map(str, ranks))


def _not_agreed(world: int, step: int, results: list, mine: list[dict]) -> str:
    found = [m["steps"][step]["found"] for m in mine]
    skipped = [r for r in range(world) if found[r]]
    stepped = [r for r in range(world) if not found[r]]
    skips = "; ".join(
        f"rank {r} skipped {[s for s, row in enumerate(m['steps']) if row['found']]}"
        for r, m in enumerate(mine)
    )
    drift = max(
        float((a - b).abs().max())
        for m, (right, _) in zip(mine, results)
        for a, b in zip(m["steps"][-1]["shards"], right["steps"][-1]["shards"])
    )
    return (
        f"on {world} ranks, step {step}: {_rank_list(skipped)} found an inf or NaN in its "
        f"own shard and skipped the step, while {_rank_list(stepped)} found none and "
        f"stepped: the ranks did not agree. Over {AGREE_STEPS} steps {skips}: the shards of "
        "one model were updated at different steps, a model no single process would produce "
        f"(they differ from the run where every rank skips together by up to {drift:.2g}). "
        "All-reduce the flag (0 or 1) "
        "with ReduceOp.MAX before deciding, so every rank skips when any rank overflowed."
    )


def check_found_inf_agreement(found_inf_on_any_rank: Callable) -> None:
    """Run `found_inf_on_any_rank(grads) -> bool` inside FSDP training on 2 and 3 ranks."""
    for world in AGREE_WORLDS:
        results = run_on_world(_agree_rank, world, found_inf_on_any_rank, hang_hint=AGREE_HANG_HINT)
        mine = [m for _, m in results]
        for step in range(AGREE_STEPS):
            rows = [m["steps"][step] for m in mine]
            where = f"on {world} ranks, step {step}"
            bad = next((r for r in rows if r["found"] is None), None)
            if bad is not None:
                fail(f"{where}: found_inf_on_any_rank returned a {bad['kind']}: return a bool.")
            found = [r["found"] for r in rows]
            local = [r["local"] for r in rows]
            if len(set(found)) > 1:
                if found == local:
                    fail(_not_agreed(world, step, results, mine))
                fail(
                    f"{where}: the ranks returned {found}: every rank must return the same "
                    "answer, the flag all-reduced over the ranks."
                )
            agreed, anywhere = found[0], any(local)
            if agreed == anywhere:
                continue
            value = INJECT.get(step, (None, None))[1]
            holders = [r for r in range(world) if local[r]]
            if not agreed and value is not None and math.isnan(value):
                fail(
                    f"{where}: {_rank_list(holders)} held a NaN in its gradient and "
                    "found_inf_on_any_rank returned False: torch.isinf misses NaN. Test "
                    "~torch.isfinite(g): an overflow shows as inf or NaN (inf - inf)."
                )
            if not agreed and len(holders) < world:
                fail(
                    f"{where}: {_rank_list(holders)} held an inf, the others none, and every "
                    "rank returned False: the flag must be True when *any* rank overflowed. "
                    "All-reduce it with ReduceOp.MAX (or SUM and test > 0), not MIN or PRODUCT."
                )
            if not agreed:
                fail(f"{where}: every rank held an inf, and found_inf_on_any_rank said False.")
            fail(
                f"{where}: found_inf_on_any_rank returned True, but no rank's gradient holds "
                "an inf or NaN: test ~torch.isfinite(g).any() over this rank's gradients."
            )
        flag = theory.FOUND_INF_BYTES
        for rank, m in enumerate(mine):
            for step, row in enumerate(m["steps"]):
                where = f"on {world} ranks, rank {rank}, step {step}"
                ops = [op for op, *_ in row["records"]]
                payload = sum(p for _, p, _ in row["records"])
                if not ops:
                    fail(
                        f"{where}: the answers agree, but no collective went through "
                        "minidist.comm: call comm.all_reduce(flag, op=comm.ReduceOp.MAX), so "
                        "that the ledger sees it."
                    )
                if payload >= row["grad_bytes"]:
                    fail(
                        f"{where}: the answers agree, but the ledger shows {ops} with "
                        f"{payload} bytes of payload: you reduced the gradients themselves. "
                        f"Each rank's shards hold other chunks of the model, so a sum of them "
                        f"means nothing (and overwrites them); one flag of {flag} bytes is "
                        f"enough, {theory.found_inf_bytes(world):g} bytes sent per step."
                    )
                if len(ops) > 1:
                    fail(
                        f"{where}: the answers agree, but the ledger shows {ops}: one "
                        "all-reduce per step is enough. Combine this rank's gradients into one "
                        "flag first (torch.maximum of the per-tensor flags), then all-reduce it."
                    )
                if row["mutated"]:
                    fail(
                        f"{where}: found_inf_on_any_rank changed the gradients it was given: "
                        "only read them (torch.isfinite(g)), the optimizer steps with them."
                    )
    passed(
        f"found_inf_on_any_rank gives every rank the same answer on {_and(AGREE_WORLDS)} "
        "ranks (an inf on the last rank only, a NaN on rank 0 only, an inf everywhere): one "
        f"all-reduce of a {theory.FOUND_INF_BYTES}-byte flag per step, and every rank skips "
        "together"
    )


# -- exercise 3: a mean in fp16 ----------------------------------------------------------------

FP16_WORLDS = (2, 4)
FP16_HANG_HINT = "Every rank must call comm.all_reduce once, on a tensor of the same size."
TINY = 2.0**-23


def fp16_input(rank: int) -> torch.Tensor:
    """Rank r's fp16 gradient: a large value, a tiny one and an ordinary one."""
    return torch.tensor([30000.0 - 2000.0 * rank, TINY, rank + 1.0], dtype=torch.float16)


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
