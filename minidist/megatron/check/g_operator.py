"""megatron checker: exercise 1: g as an autograd Function."""

from __future__ import annotations

import torch

from ... import comm
from ...course.check import close, fail, passed, run_on_world
from ...runtime import RankFailedError
from ..layout import ParallelLayout
from ._shared import _and

G_WORLDS = (2, 4)  # tp = 2: on 2 ranks the group is the world, on 4 two groups of 2
G_TP = 2
G_NUMEL = 6
G_HANG_HINT = (
    "g makes one all-reduce in forward, on every rank of the tp group, and none in backward."
)


def _g_input(tp_rank: int) -> torch.Tensor:
    """(i + 1) + 100·2^q at element i on tp rank q: every sum and every rank recognisable."""
    return torch.arange(1, G_NUMEL + 1, dtype=torch.float32, device="cpu") + 100 * 2**tp_rank


def _g_upstream() -> torch.Tensor:
    """The gradient arriving at g's output: the same on every rank (after g all is replicated)."""
    return torch.tensor([1.0, -2.0, 3.0, 0.5, -1.5, 2.0], device="cpu")[:G_NUMEL]


def _g_rank(cls: type) -> dict:
    layout = ParallelLayout(tp=G_TP)
    group = layout.group("tp")
    leaf = _g_input(layout.tp_rank).requires_grad_()
    x = leaf * 1.0  # a partial output, as F.linear's would be: not a leaf
    before = x.detach().clone()
    with comm.record() as forward:
        y = cls.apply(x, group)
    out = dict(
        y=y.detach().clone() if isinstance(y, torch.Tensor) else type(y).__name__,
        x_after=x.detach().clone(),
        before=before,
        forward=[(r.op, r.group_ranks, r.payload_bytes) for r in forward.records],
        tp_ranks=layout.mine["tp"],
    )
    if not isinstance(y, torch.Tensor) or not y.requires_grad:
        out["grad"] = None
        out["backward"] = []
        return out
    with comm.record() as backward:
        y.backward(_g_upstream())
    out["grad"] = None if leaf.grad is None else leaf.grad.clone()
    out["backward"] = [(r.op, r.group_ranks, r.payload_bytes) for r in backward.records]
    return out


def _diagnose_g(res: dict, rank: int, world: int) -> str | None:
    tp_ranks = res["tp_ranks"]
    t = len(tp_ranks)
    q = tp_ranks.index(rank)
    own = _g_input(q)
    group_sum = sum(_g_input(j) for j in range(t))
    world_sum = sum(_g_input(j % t) for j in range(world))
    up = _g_upstream()
    y, grad = res["y"], res["grad"]
    where = f"on a world of {world} (tp group {tp_ranks}), rank {rank}"
    if not isinstance(y, torch.Tensor):
        return f"{where}: forward returned a {y}; return the all-reduced tensor."
    if y.shape != own.shape:
        return f"{where}: forward returned shape {tuple(y.shape)}; g keeps x's shape."
    mutated = not torch.equal(res["x_after"], res["before"])
    if close(y, own):
        if grad is not None and close(grad, t * up):
            return (
                f"{where}: forward returned this rank's own partial output, and backward "
                f"all-reduced the gradient ({t}x the upstream gradient): that is f, g's "
                "conjugate. g all-reduces in FORWARD (the partial outputs X_r·W_r of a "
                "row-parallel layer are summed) and is the identity in backward."
            )
        if grad is not None and close(grad, up):
            return (
                f"{where}: forward returned this rank's own partial output and backward passed "
                "the gradient through: identity both ways, nothing was all-reduced. g sums "
                "the partial outputs: comm.all_reduce(out, group=group) in forward."
            )
        return (
            f"{where}: forward returned this rank's own partial output; g returns the sum of "
            "every tp rank's partial output (comm.all_reduce in forward)."
        )
    if t < world and close(y, world_sum):
        return (
            f"{where}: forward returned the sum over all {world} ranks of the world; g sums "
            f"over the {t} ranks of its tp group {tp_ranks}: pass group=group to "
            "comm.all_reduce (the other tp groups hold other layers' or other batches' parts)."
        )
    if close(y, group_sum / t):
        return (
            f"{where}: forward returned the mean over the tp group; g returns the SUM: each "
            f"rank's partial output X_r·W_r is one of {t} terms of X·W, none is divided."
        )
    if not close(y, group_sum):
        return (
            f"{where}: forward returned {y.tolist()}; g's forward output is the sum of the tp "
            f"group's partial outputs, here {group_sum.tolist()}."
        )
    if mutated:
        return (
            f"{where}: the output is right, but your forward all-reduced its input x in place: "
            "the caller's x now holds the sum too. An autograd Function must not change its "
            "inputs (x may be kept by the caller or saved by the op that made it for its own "
            "backward): all-reduce a copy, out = x.clone()."
        )
    if grad is None:
        return (
            f"{where}: the forward is right, but no gradient reached x: backward must return "
            "the gradient for x (and None for group)."
        )
    if close(grad, t * up):
        return (
            f"{where}: the forward is right, but backward all-reduced the gradient too ({t}x "
            "the upstream gradient). After g every rank holds the same full output, so the "
            "gradient arriving at it is already the same on every rank: g's backward is the "
            "identity (its all-reduce of gradients is f's job, at the region's start)."
        )
    if not close(grad, up):
        return (
            f"{where}: the forward is right, but backward returned {grad.tolist()} for an "
            f"upstream gradient {up.tolist()}; g's backward is the identity: return grad, None."
        )
    return None


def _diagnose_g_ledger(res: dict, rank: int, world: int) -> str | None:
    tp_ranks = tuple(res["tp_ranks"])
    size = 4 * G_NUMEL
    want = [("all_reduce", tp_ranks, size)]
    got = [(op, tuple(ranks), n) for op, ranks, n in res["forward"]]
    where = f"on a world of {world}, rank {rank}"
    if not got:
        return (
            f"{where}: the values are right, but the ledger saw no collective: call "
            "minidist's comm.all_reduce (torch.distributed called directly is invisible to it)."
        )
    if got != want:
        return (
            f"{where}: the values are right, but forward made {[op for op, _, _ in got]}; g is "
            f"one comm.all_reduce of x ({size} bytes) over its tp group {list(tp_ranks)}."
        )
    if res["backward"]:
        return f"{where}: backward made {[op for op, _, _ in res['backward']]}; g's makes none."
    return None


def check_reduce_from_tp(reduce_from_tp_cls: type) -> None:
    """g, `ReduceFromTP.apply(x, group)`, on worlds of 2 and 4 (tp groups of 2)."""
    for world in G_WORLDS:
        try:
            results = run_on_world(_g_rank, world, reduce_from_tp_cls, hang_hint=G_HANG_HINT)
        except RankFailedError as exc:
            if "incorrect number of gradients" in str(exc):
                fail(
                    "backward returned the wrong number of gradients: it returns one per input "
                    "of forward, (grad_x, None): None for `group`, which has no gradient."
                )
            raise
        for rank, res in enumerate(results):
            problem = _diagnose_g(res, rank, world) or _diagnose_g_ledger(res, rank, world)
            if problem:
                fail(problem)
    passed(
        f"g sums the tp group's partial outputs in forward (one all-reduce, input untouched) "
        f"and passes the gradient through in backward, on worlds of {_and(G_WORLDS)}"
    )
