"""megatron checker: exercise 4: data parallelism across tensor-parallel groups."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from ... import comm
from ...course.check import close, diagnose_values, fail, passed, run_on_world
from ...data import shard_batch
from ..fixture import build_dense
from ..layout import ParallelLayout
from ..model import TensorParallelGPT

DP_WORLD, DP_TP = 4, 2
DP_HANG_HINT = (
    "Every rank of a dp group must all-reduce the same gradients in the same order (loop over "
    "model.parameters(), the same on every rank)."
)


def _dp_rank(fn: Callable) -> dict:
    layout = ParallelLayout(tp=DP_TP)
    model, batches, _ = build_dense()
    tp = TensorParallelGPT(model, layout.group("tp"))
    x, y = shard_batch(batches[0], layout.dp_rank, layout.dp_size)
    tp.loss(tp(x), y).backward()
    named = [(n, p) for n, p in tp.named_parameters() if p.grad is not None]
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
    with comm.record() as ledger:
        fn(tp, layout.group("dp"))
    got = {n: p.grad.detach().clone() for n, p in named if p.grad is not None}
    return dict(
        got=got, right=right, local=local, over_world=over_world, over_tp=over_tp,
        records=[(r.op, r.group_ranks, r.ring_bytes) for r in ledger.records],
        dp_ranks=layout.mine["dp"], tp_ranks=layout.mine["tp"], tp_rank=layout.tp_rank,
        splits={n: getattr(p, "tp_split", None) for n, p in named},
        trainable=sum(p.numel() for _, p in named),
    )  # fmt: skip


def _dense_grads() -> dict[str, torch.Tensor]:
    """The dense GPT's gradients on the whole first batch (one process)."""
    model, batches, loss_fn = build_dense()
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


def _diagnose_dp(res: dict, rank: int) -> str | None:
    got, right, dp_ranks, tp_ranks = res["got"], res["right"], res["dp_ranks"], res["tp_ranks"]
    d, world = len(dp_ranks), DP_WORLD
    where = f"rank {rank} (tp group {tp_ranks}, dp group {dp_ranks})"
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
    problem = diagnose_values(got, right, res["local"], d)
    if problem and f"divide by the world size N={d}" in problem:
        return (
            f"{where}: the gradients are {d}x too large: you summed over the dp group but did "
            f"not divide by its size, dist.get_world_size(dp_group) = {d}."
        )
    return f"{where}: {problem}" if problem else None


def check_average_dp_gradients(average_dp_gradients: Callable) -> None:
    """`average_dp_gradients(model, dp_group)` on a world of 4: t = 2 inside, d = 2 across."""
    results = run_on_world(_dp_rank, DP_WORLD, average_dp_gradients, hang_hint=DP_HANG_HINT)
    dense = _dense_grads()
    for rank, res in enumerate(results):
        problem = _diagnose_dp(res, rank)
        if problem:
            fail(problem)
        where = f"rank {rank}"
        dp_ranks = tuple(res["dp_ranks"])
        groups = {ranks for _, ranks, _ in res["records"]}
        sent = sum(b for _, _, b in res["records"])
        theory_bytes = comm.ring_bytes("all_reduce", 4 * res["trainable"], len(dp_ranks))
        if not res["records"]:
            fail(
                f"{where}: the values are right, but the ledger saw no collective: use "
                "minidist's comm.all_reduce (torch.distributed directly is invisible to it)."
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
    passed(
        f"average_dp_gradients averages over the dp groups only: on {DP_WORLD} ranks (t = "
        f"{DP_TP} inside, d = {DP_WORLD // DP_TP} across) every rank's slices of the gradient "
        "equal the dense GPT's on the whole batch, with one all-reduce's bytes per gradient"
    )
