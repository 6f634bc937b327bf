"""megatron checker: exercise 1: g as an autograd Function."""

from __future__ import annotations

import torch

from ... import comm
from ...course.check import close, fail, passed, run_on_world
from ...runtime import RankFailedError
from ..layout import ParallelLayout
from ._shared import _and, torch_collectives

# (world, tp): on 2 and 3 ranks the group is the world, on 4 two groups of 2
G_CASES = ((2, 2), (3, 3), (4, 2))
G_WORLDS = tuple(w for w, _ in G_CASES)
G_NUMEL = 6
G_HANG_HINT = (
    "g makes one all-reduce in forward, on every rank of the tp group, and none in backward."
)


def _g_input(tp_rank: int) -> torch.Tensor:
    """(i + 1) + 100·2^q at element i on tp rank q: every sum and every rank recognisable."""
    return torch.arange(1, G_NUMEL + 1, dtype=torch.float32, device="cpu") + 100 * 2**tp_rank


def _g_upstream(tp_rank: int) -> torch.Tensor:
    """The gradient arriving at g's output. In a model it is the same on every rank (after g
    all is replicated); here each tp rank gets its own, so that any communication in
    backward changes the values (identity returns this rank's own)."""
    return (
        torch.tensor([1.0, -2.0, 3.0, 0.5, -1.5, 2.0], device="cpu")[:G_NUMEL] + 10.0 * 3**tp_rank
    )


def _g_rank(cls: type, tp: int) -> dict:
    layout = ParallelLayout(tp=tp)
    group = layout.group("tp")
    leaf = _g_input(layout.tp_rank).requires_grad_()
    x = leaf * 1.0  # a partial output, as F.linear's would be: not a leaf
    before = x.detach().clone()
    with comm.record() as forward, torch_collectives() as forward_calls:
        y = cls.apply(x, group)
    unwaited = forward_calls.unwaited()
    out = dict(
        y=y.detach().clone() if isinstance(y, torch.Tensor) else type(y).__name__,
        x_after=x.detach().clone(),
        before=before,
        forward=[(r.op, r.group_ranks, r.payload_bytes) for r in forward.records],
        forward_calls=list(forward_calls),
        unwaited=unwaited,
        backward_calls=[],
        tp_ranks=layout.mine["tp"],
    )
    if not isinstance(y, torch.Tensor) or not y.requires_grad:
        out["grad"] = None
        out["backward"] = []
        return out
    with comm.record() as backward, torch_collectives() as backward_calls:
        y.backward(_g_upstream(layout.tp_rank))
    out["grad"] = None if leaf.grad is None else leaf.grad.clone()
    out["backward"] = [(r.op, r.group_ranks, r.payload_bytes) for r in backward.records]
    out["backward_calls"] = list(backward_calls)
    return out


def _diagnose_g(res: dict, rank: int, world: int) -> str | None:
    if res["unwaited"]:
        return (
            f"on a world of {world}, rank {rank}: forward returned while its async all-reduce "
            "was still running (nobody called wait() on the work it returned): the output "
            "may not hold the sum yet. Call work.wait() before returning, or all-reduce "
            "without async_op."
        )
    return _diagnose_g_values(res, rank, world)


def _diagnose_g_values(res: dict, rank: int, world: int) -> str | None:
    tp_ranks = res["tp_ranks"]
    t = len(tp_ranks)
    q = tp_ranks.index(rank)
    own = _g_input(q)
    group_sum = sum(_g_input(j) for j in range(t))
    world_sum = sum(_g_input(j % t) for j in range(world))
    up = _g_upstream(q)
    up_sum = sum(_g_upstream(j) for j in range(t))
    y, grad = res["y"], res["grad"]
    where = f"on a world of {world} (tp group {tp_ranks}), rank {rank}"
    if not isinstance(y, torch.Tensor):
        return f"{where}: forward returned a {y}; return the all-reduced tensor."
    if y.shape != own.shape:
        return f"{where}: forward returned shape {tuple(y.shape)}; g keeps x's shape."
    mutated = not torch.equal(res["x_after"], res["before"])
    if close(y, own):
        if grad is not None and close(grad, up_sum):
            return (
                f"{where}: forward returned this rank's own partial output, and backward "
                f"all-reduced the gradient (the sum of the {t} ranks' upstream gradients): "
                "that is f, g's "
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
    both = (
        "After g every rank holds the same full output, so the gradient arriving at it is "
        "already the same on every rank: g's backward is the identity (its all-reduce of "
        "gradients is f's job, at the region's start). The checker gives each rank its own "
        "upstream gradient to see any communication in backward."
    )
    if close(grad, up_sum):
        return (
            f"{where}: the forward is right, but backward all-reduced the gradient too (it "
            f"returned the sum of the {t} ranks' upstream gradients). {both}"
        )
    if close(grad, up_sum / t):
        return (
            f"{where}: the forward is right, but backward averaged the gradient over the tp "
            f"group (it returned the mean of the {t} ranks' upstream gradients). {both}"
        )
    if close(grad, up / t):
        return (
            f"{where}: the forward is right, but backward divided the gradient by t={t}: the "
            "output is a sum, each input enters it once, so its gradient is the upstream "
            "gradient itself: return grad, None."
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
    direct = len(res["forward_calls"]) - len(got)
    if not got or direct > 0:
        return (
            f"{where}: the values are right, but forward called torch.distributed directly "
            f"({res['forward_calls']}; the ledger saw {len(got)} collective(s)): call "
            "minidist's comm.all_reduce, so that the ledger sees and prices it."
        )
    if res["backward_calls"]:
        return (
            f"{where}: backward called torch.distributed's {res['backward_calls']} (the ledger "
            f"saw {len(res['backward'])} of them): g's backward makes no collective at all, it "
            "is the identity; and every collective goes through minidist.comm."
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
    for world, tp in G_CASES:
        try:
            results = run_on_world(_g_rank, world, reduce_from_tp_cls, tp, hang_hint=G_HANG_HINT)
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
        f"and passes the gradient through in backward, on worlds of {_and(G_WORLDS)} (tp groups "
        f"of {_and([t for _, t in G_CASES])}), no collective in backward"
    )
