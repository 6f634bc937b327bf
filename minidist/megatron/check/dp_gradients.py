"""megatron checker: exercise 4: data parallelism across tensor-parallel groups."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from ... import comm
from ...course.check import CheckFailed, close, diagnose_values, fail, passed, run_on_world
from ...data import shard_batch
from ..fixture import build_dense
from ..layout import ParallelLayout
from ..model import TensorParallelGPT
from ._shared import torch_collectives

# (world, t): d = world / t ranks across; d != t on 6 ranks, so that the dp and the tp
# group's sizes (and d - 1, and the world size) tell apart (the GPT's hidden size 32 takes
# t = 2 or 4)
DP_LAYOUTS = ((4, 2), (6, 2))
DP_WORLD, DP_TP = DP_LAYOUTS[0]
DP_BATCH = 12  # sequences: split evenly by d = 2 and 3
DP_HANG_HINT = (
    "Every rank of a dp group must all-reduce the same gradients in the same order (loop over "
    "model.parameters(), the same on every rank)."
)


def _dp_rank(fns: list[Callable], tp_size: int) -> list[dict]:
    """One backward, then each of `fns` on a fresh copy of its gradients (many answers in one
    world launch)."""
    layout = ParallelLayout(tp=tp_size)
    model, batches, _ = build_dense(global_batch=DP_BATCH)
    tp = TensorParallelGPT(model, layout.group("tp"))
    x, y = shard_batch(batches[0], layout.dp_rank, layout.dp_size)
    tp.loss(tp(x), y).backward()
    named = [(n, p) for n, p in tp.module.named_parameters() if p.grad is not None]
    local = {n: p.grad.detach().clone() for n, p in named}

    def mean_over(group) -> dict:
        out = {}
        for n, g in local.items():
            t = g.clone()
            comm.all_reduce(t, group=group)  # no ledger is open yet: the checker's own
            out[n] = t / dist.get_world_size(group)
        return out

    right = mean_over(layout.group("dp"))
    over_world, over_tp = mean_over(None), mean_over(layout.group("tp"))
    out = []
    for fn in fns:
        for n, p in named:
            p.grad = local[n].clone()
        with comm.record() as ledger, torch_collectives() as calls:
            fn(tp, layout.group("dp"))
        unwaited = calls.unwaited()
        got = {n: p.grad.detach().clone() for n, p in named if p.grad is not None}
        out.append(
            dict(
                got=got,
                right=right,
                local=local,
                over_world=over_world,
                over_tp=over_tp,
                records=[(r.op, r.group_ranks, r.ring_bytes) for r in ledger.records],
                calls=list(calls),
                world=dist.get_world_size(),
                unwaited=unwaited,
                dp_ranks=layout.mine["dp"],
                tp_ranks=layout.mine["tp"],
                tp_rank=layout.tp_rank,
                splits={n: getattr(p, "tp_split", None) for n, p in named},
                trainable=sum(p.numel() for _, p in named),
            )
        )
    return out


def _dense_grads() -> dict[str, torch.Tensor]:
    """The dense GPT's gradients on the whole first batch (one process)."""
    model, batches, loss_fn = build_dense(global_batch=DP_BATCH)
    x, y = batches[0]
    loss_fn(model(x), y).backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _part(full: torch.Tensor, split, tp_rank: int, tp: int) -> torch.Tensor:
    """Rank `tp_rank`'s part of a dense tensor, as the tensor-parallel layers cut it
    (`split` = (dim, blocks, size): `blocks` sections each cut in `tp`, padded to a multiple
    of `tp` along `dim`); the whole tensor where `split` is None (replicated)."""
    if split is None:
        return full
    dim, blocks, _ = split
    padded = -(-full.shape[dim] // (tp * blocks)) * tp * blocks
    if padded > full.shape[dim]:
        shape = list(full.shape)
        shape[dim] = padded - full.shape[dim]
        full = torch.cat([full, full.new_zeros(shape)], dim)
    return torch.cat([s.chunk(tp, dim)[tp_rank] for s in full.chunk(blocks, dim)], dim)


def _scaled(got: dict, ref: dict, factor: float) -> bool:
    return all(n in got and close(got[n], factor * ref[n]) for n in ref)


def _uniform_scale(res: dict) -> float | None:
    """c when every gradient is c times the right mean, else None."""
    got, right = res["got"], res["right"]
    if not right or right.keys() - got.keys():
        return None
    c = sum(float((got[n] * right[n]).sum()) for n in right)
    c /= max(sum(float((right[n] * right[n]).sum()) for n in right), 1e-30)
    return c if _scaled(got, right, c) else None


# wrong divisions -> (the factor they leave, given t, d and the world size n; what they did)
_DIVISIONS = (
    (lambda t, d, n: d, "summed over the dp group but did not divide by its size"),
    (lambda t, d, n: d / t, "divided by the tp group's size t instead of the dp group's d"),
    (lambda t, d, n: d / (d - 1), "divided by d - 1 instead of the dp group's size d"),
    (lambda t, d, n: d / n, "divided by the world size n instead of the dp group's size d"),
    (lambda t, d, n: 1 / d, "divided by d twice (before and after the all-reduce)"),
)


def _division_mistake(layouts: dict) -> str | None:
    """The wrong divisor that explains the gradients' scale on every layout, if any."""
    scales = {}
    for (world, t), results in layouts.items():
        cs = [_uniform_scale(res) for res in results]
        if any(c is None for c in cs):
            return None
        scales[world, t] = cs[0]
    for factor, what in _DIVISIONS:
        if all(abs(c - factor(t, w // t, w)) < 1e-3 * c for (w, t), c in scales.items()):
            seen = "; ".join(
                f"{w} ranks, t={t}, d={w // t}: {c:.4g}x the mean" for (w, t), c in scales.items()
            )
            return (
                f"the gradients are off by a uniform factor ({seen}): you {what}. Divide the "
                "all-reduced sum by dist.get_world_size(dp_group)."
            )
    return None


def _diagnose_dp(res: dict, rank: int) -> str | None:
    dp_ranks, tp_ranks = res["dp_ranks"], res["tp_ranks"]
    d, world = len(dp_ranks), res["world"]
    where = f"on {world} ranks (t={len(tp_ranks)}, d={d}), rank {rank} (tp group {tp_ranks}, "
    where += f"dp group {dp_ranks})"
    return _wrong_group(res, rank) or _wrong_values(res, where)


def _wrong_group(res: dict, rank: int) -> str | None:
    got, right, dp_ranks, tp_ranks = res["got"], res["right"], res["dp_ranks"], res["tp_ranks"]
    d, world = len(dp_ranks), res["world"]
    where = f"on {world} ranks (t={len(tp_ranks)}, d={d}), rank {rank} (tp group {tp_ranks}, "
    where += f"dp group {dp_ranks})"
    for name, variant in (("over_world", res["over_world"]), ("over_tp", res["over_tp"])):
        n = world if name == "over_world" else len(tp_ranks)
        if right and any(_scaled(got, variant, f) for f in (1.0, n, n / d, n / world)):
            if name == "over_world":
                return (
                    f"{where}: you reduced over the whole world (group=None): ranks {tp_ranks} "
                    "hold DIFFERENT slices of every split weight, so the sum adds rank 0's "
                    "slice to rank 1's. Reduce over the ranks that hold the same slice: "
                    "comm.all_reduce(p.grad, group=dp_group)."
                )
            return (
                f"{where}: you reduced over the tp group {tp_ranks}: those ranks saw the SAME "
                "data slice and hold different parts of the model; the ranks that hold the "
                f"same part and saw other data are the dp group {dp_ranks}: group=dp_group."
            )
    return None


def _wrong_values(res: dict, where: str) -> str | None:
    got, right, d, world = res["got"], res["right"], len(res["dp_ranks"]), res["world"]
    if _scaled(got, right, d / world) and d / world != 1 / d:
        return (
            f"{where}: the gradients are {world // d}x too small: you divided by the world "
            f"size {world}; divide by the dp group's size, dist.get_world_size(dp_group) = {d}."
        )
    if _scaled(got, right, 1 / d):
        return (
            f"{where}: the gradients are {d}x too small: you divided by {d} twice, or by the "
            f"world size {world} instead of the dp group's size {d} "
            "(dist.get_world_size(dp_group))."
        )
    if all(close(got[n], res["local"][n] / d) for n in right):
        return (
            f"{where}: every gradient is this rank's own divided by d={d}: the all-reduce's "
            "result never reached p.grad (it went into a copy: p.grad.clone(), p.grad.float(), "
            "or p.grad = ... rebound to a new tensor). comm.all_reduce works in place: pass "
            "p.grad itself."
        )
    problem = diagnose_values(got, right, res["local"], d)
    if problem and f"divide by the world size N={d}" in problem:
        return (
            f"{where}: the gradients are {d}x too large: you summed over the dp group but did "
            f"not divide by its size, dist.get_world_size(dp_group) = {d}."
        )
    return f"{where}: {problem}" if problem else None


def average_dp_verdicts(fns: list[Callable]) -> list[str | None]:
    """The checker's message for each of `fns` (None: right), all run in one world launch
    per layout."""
    runs = {
        (world, t): run_on_world(
            _dp_rank, world, list(fns), t, hang_hint=DP_HANG_HINT, timeout_s=10 + 2 * len(fns)
        )
        for world, t in DP_LAYOUTS
    }
    verdicts = []
    for i in range(len(fns)):
        try:
            _judge({layout: [rank[i] for rank in ranks] for layout, ranks in runs.items()})
            verdicts.append(None)
        except CheckFailed as exc:
            verdicts.append(str(exc))
    return verdicts


def check_average_dp_gradients(average_dp_gradients: Callable) -> None:
    """`average_dp_gradients(model, dp_group)` on worlds of 4 (t = d = 2) and 6 (t = 2,
    d = 3)."""
    problem = average_dp_verdicts([average_dp_gradients])[0]
    if problem:
        fail(problem)
    passed(
        "average_dp_gradients averages over the dp groups only: on 4 ranks (t = d = 2) and 6 "
        "(t = 2, d = 3) every rank's slices of the gradient equal the dense "
        "GPT's on the whole batch, with one all-reduce's bytes per gradient, over the dp group"
    )


def _judge(layouts: dict) -> None:
    for (world, t), results in layouts.items():
        for rank, res in enumerate(results):
            if res["unwaited"]:
                fail(
                    f"on {world} ranks (t={t}), rank {rank}: {res['unwaited']} of your async "
                    "all-reduces were never waited for: the gradient was divided (or "
                    "returned) while the sum was still being written into it. Keep each work "
                    "comm.all_reduce(..., async_op=True) returns and call work.wait() before "
                    "touching p.grad, or call it without async_op."
                )
    for results in layouts.values():
        for rank, res in enumerate(results):
            problem = _wrong_group(res, rank)
            if problem:
                fail(problem)
    problem = _division_mistake(layouts)
    if problem:
        fail(problem)
    for results in layouts.values():
        _check_layout(results)


def _check_layout(results: list[dict]) -> None:
    dense = _dense_grads()
    for rank, res in enumerate(results):
        problem = _diagnose_dp(res, rank)
        if problem:
            fail(problem)
        where = f"on {res['world']} ranks (t={len(res['tp_ranks'])}), rank {rank}"
        dp_ranks = tuple(res["dp_ranks"])
        groups = {ranks for _, ranks, _ in res["records"]}
        sent = sum(b for _, _, b in res["records"])
        theory_bytes = comm.ring_bytes("all_reduce", 4 * res["trainable"], len(dp_ranks))
        if not res["records"] or len(res["calls"]) > len(res["records"]):
            fail(
                f"{where}: the values are right, but torch.distributed was called directly "
                f"({len(res['calls'])} collectives, {len(res['records'])} in the ledger): use "
                "minidist's comm.all_reduce, so that the ledger sees and prices it."
            )
        if groups != {dp_ranks} or abs(sent - theory_bytes) > 1e-6 * theory_bytes:
            fail(
                f"{where}: the values are right, but the ledger shows {sent:.0f} bytes sent over "
                f"groups {sorted(groups)}; one all-reduce of this rank's {res['trainable']} "
                f"gradient elements over its dp group {list(dp_ranks)} sends "
                f"2(d-1)/d·4·{res['trainable']} = {theory_bytes:.0f}."
            )
        t = len(res["tp_ranks"])
        for n, split in res["splits"].items():
            if not close(res["got"][n], _part(dense[n], split, res["tp_rank"], t), atol=1e-6):
                fail(  # the mean over the dp group is right: the layout itself would be wrong
                    f"{where}: {n}'s gradient is the mean over the dp group, yet differs from "
                    "the dense GPT's on the whole batch: report this to the course authors."
                )
