"""Lesson 14, exercise 1: ḡ, the reduce-scatter that leaves a tensor-parallel region."""

from __future__ import annotations

import math
import re

import torch

from ... import comm
from ...course.check import CheckFailed, close, fail, passed, run_on_world
from ...course.failures import local_collective_cause
from ...megatron.layout import ParallelLayout
from ...runtime import RankFailedError

SP_CASES = ((2, 2), (3, 3), (4, 2))  # (world, tp): on 4, two tp groups of 2
SP_SHAPE = (2, 12, 24)  # b, s, h: s and h divide by 2, 3 and 4, and differ
SP_HANG_HINT = (
    "ḡ makes one reduce-scatter in forward and one all-gather in backward, on every rank of "
    "the tp group, with the same sizes."
)


def _inputs(tp_rank: int, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + tp_rank)
    b, s, h = SP_SHAPE
    return torch.randn(b, h, s, device="cpu", generator=g, dtype=torch.float64).to(dtype)


def _upstream(tp_rank: int, t: int, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(200 + tp_rank)
    b, s, h = SP_SHAPE
    return torch.randn(b, s // t, h, device="cpu", generator=g, dtype=torch.float64).to(dtype)


def _sp_rank(cls: type, tp: int) -> list[dict]:
    layout = ParallelLayout(tp=tp)
    group, q = layout.group("tp"), layout.tp_rank
    out = []
    for dtype, transposed in ((torch.float64, True), (torch.float32, False)):
        base = _inputs(q, dtype)
        leaf = base.transpose(1, 2) if transposed else base.transpose(1, 2).contiguous()
        leaf = leaf.detach().requires_grad_()
        x = leaf * 1  # not a leaf, as a row-parallel Linear's partial output
        before = x.detach().clone()
        res = dict(dtype=dtype, transposed=transposed, tp_ranks=layout.mine["tp"], q=q)
        with comm.record() as forward:
            y = cls.apply(x, group)
        res["forward"] = [(r.op, r.group_ranks, r.payload_bytes) for r in forward.records]
        res["mutated"] = not torch.equal(x.detach(), before)
        if not isinstance(y, torch.Tensor):
            res["y"] = type(y).__name__
            out.append(res)
            continue
        res["y"] = y.detach().clone()
        if y.shape != (SP_SHAPE[0], SP_SHAPE[1] // tp, SP_SHAPE[2]) or not y.requires_grad:
            res["grad"] = None
            out.append(res)
            continue
        with comm.record() as backward:
            y.backward(_upstream(q, tp, dtype))
        res["backward"] = [(r.op, r.group_ranks, r.payload_bytes) for r in backward.records]
        res["grad"] = None if leaf.grad is None else leaf.grad.clone()
        out.append(res)
    return out


def _block(t: torch.Tensor, k: int, n: int) -> torch.Tensor:
    size = t.shape[1] // n
    return t[:, k * size : (k + 1) * size]


def _diagnose_forward(res: dict, rank: int, world: int) -> str | None:
    tp_ranks, q, dtype = res["tp_ranks"], res["q"], res["dtype"]
    t = len(tp_ranks)
    b, s, h = SP_SHAPE
    mine = _inputs(q, dtype).transpose(1, 2)
    total = sum(_inputs(j, dtype).transpose(1, 2) for j in range(t))
    world_total = sum(_inputs(j % t, dtype).transpose(1, 2) for j in range(world))
    y = res["y"]
    kind = "a non-contiguous (transposed)" if res["transposed"] else "a contiguous"
    where = f"on a world of {world} (tp group {tp_ranks}), rank {rank}, {kind} {dtype} input"
    want = _block(total, q, t)
    if not isinstance(y, torch.Tensor):
        return f"{where}: forward returned a {y}; return this rank's block, a tensor."
    if y.dtype != dtype:
        return f"{where}: forward returned {y.dtype} for a {dtype} input; keep x's dtype."
    if y.shape == (b, s, h):
        if close(y, total):
            return (
                f"{where}: forward returned the whole sequence of the sum, {tuple(y.shape)}: "
                "that is an all-reduce (lesson 07's g). ḡ reduce-scatters: each rank keeps "
                f"only its block of the sequence, [b, s/t, h] = {tuple(want.shape)}."
            )
        if close(y, mine):
            return f"{where}: forward returned its input unchanged; nothing was reduced."
        return f"{where}: forward returned the full shape {tuple(y.shape)}; keep one block."
    if y.shape == (b, s, h // t):
        return (
            f"{where}: forward returned shape {tuple(y.shape)}: you split the hidden "
            "dimension (dim 2). Sequence parallelism splits the SEQUENCE, dim 1: rank q "
            f"keeps positions [q·s/t, (q+1)·s/t), shape {tuple(want.shape)}."
        )
    if world != t and y.shape == (b, s // world, h):
        return (
            f"{where}: forward returned shape {tuple(y.shape)}: {world} blocks, the WORLD's "
            f"size; ḡ splits over its tp group of {t} ranks {tp_ranks}: use "
            "dist.get_world_size(group) and pass group=group to the collective."
        )
    if y.shape != want.shape:
        return f"{where}: forward returned shape {tuple(y.shape)}; want {tuple(want.shape)}."
    if close(y, want):
        return None
    if close(y, want / t):
        return (
            f"{where}: forward returned the MEAN over the tp group: ḡ sums the partial "
            f"outputs (each is one of {t} terms of X·W), it does not divide by t."
        )
    if t < world and close(y, _block(world_total, q, t)):
        return (
            f"{where}: forward summed over all {world} ranks of the world; ḡ sums over the "
            f"{t} ranks of its tp group {tp_ranks}: pass group=group to the collective."
        )
    for k in range(t):
        if k != q and close(y, _block(total, k, t)):
            return (
                f"{where}: forward returned block {k} of the sequence; tp rank {q} keeps "
                f"block {q} (positions [{q * (s // t)}, {(q + 1) * (s // t)})): the "
                "reduce-scatter's output chunk r goes to rank r, in rank order."
            )
    if close(y, _block(mine, q, t)):
        return f"{where}: forward returned this rank's own block, not summed over the group."
    flat = total.reshape(-1).chunk(t)[q].view(want.shape)
    if close(y, flat):
        return (
            f"{where}: forward reduce-scattered x flattened as [b, s, h]: its flat chunks "
            "split the BATCH, not the sequence. Split x along dim 1 into t blocks, make each "
            "contiguous and concatenate them before the reduce-scatter."
        )
    if res["transposed"]:
        raw = torch.stack([_inputs(j, dtype) for j in range(t)]).sum(0).reshape(-1).chunk(t)[q]
        if close(y.reshape(-1), raw):
            return (
                f"{where}: forward read x's storage, not its values: x is a transposed "
                "(non-contiguous) view, so its memory is in another order. Use "
                ".contiguous() (or torch.cat of the blocks) before flattening."
            )
    diff = (y - want).abs()
    worst = int(diff.argmax())
    pos = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst, device="cpu"), diff.shape))
    return (
        f"{where}: forward's block differs from the sum's block {q} at {int((diff > 1e-5).sum())} "
        f"of {diff.numel()} elements, most at index {pos} (got {y[pos]:.6g}, want "
        f"{want[pos]:.6g})."
    )


def _diagnose_backward(res: dict, rank: int, world: int) -> str | None:
    tp_ranks, q, dtype = res["tp_ranks"], res["q"], res["dtype"]
    t = len(tp_ranks)
    where = f"on a world of {world} (tp group {tp_ranks}), rank {rank}"
    grad = res["grad"]
    ups = [_upstream(j, t, dtype) for j in range(t)]
    want = torch.cat(ups, dim=1)
    if grad is None:
        return (
            f"{where}: the forward is right, but no gradient reached x: backward returns the "
            "gradient for x (and None for group)."
        )
    if close(grad, want):
        return None
    if close(grad, t * want) or close(grad, want / t):
        return (
            f"{where}: backward's gradient is {t if close(grad, t * want) else f'1/{t}'} times "
            "the gathered blocks: ḡ's backward only gathers (no sum, no division)."
        )
    zero = torch.zeros_like(want)
    for k in range(t):
        padded = zero.clone()
        padded[:, k * ups[0].shape[1] : (k + 1) * ups[0].shape[1]] = ups[q]
        if close(grad, padded):
            return (
                f"{where}: backward put this rank's gradient block in place and zeros "
                "elsewhere. x's gradient is needed at every position: each position's "
                "gradient lives on the rank that holds it, so all-gather the blocks."
            )
    if close(grad, torch.cat([ups[q]] * t, dim=1)):
        return (
            f"{where}: backward repeated this rank's own gradient block t times; gather "
            "every rank's block instead (comm.all_gather), in rank order."
        )
    if close(grad, torch.cat(ups[::-1], dim=1)):
        return f"{where}: backward gathered the blocks in reverse order; rank order is block order."
    return (
        f"{where}: backward returned a gradient that is not the rank-ordered all-gather of "
        f"the gradient blocks (largest difference {float((grad - want).abs().max()):.3g})."
    )


def _diagnose_ledger(res: dict, rank: int, world: int) -> str | None:
    tp_ranks = tuple(res["tp_ranks"])
    nbytes = math.prod(SP_SHAPE) * torch.empty(0, dtype=res["dtype"], device="cpu").element_size()
    where = f"on a world of {world}, rank {rank}"
    fwd = [(op, tuple(r), n) for op, r, n in res["forward"]]
    if not fwd:
        return (
            f"{where}: the values are right but the ledger saw no collective in forward: use "
            "minidist's comm.reduce_scatter (torch.distributed called directly is invisible "
            "to it)."
        )
    if fwd != [("reduce_scatter", tp_ranks, nbytes)]:
        ops = [op for op, _, _ in fwd]
        return (
            f"{where}: the values are right, but forward made {ops}; ḡ is ONE "
            f"comm.reduce_scatter of the whole [b, s, h] tensor ({nbytes} bytes) over the tp "
            f"group {list(tp_ranks)}: the same bytes as half of an all-reduce."
        )
    bwd = [(op, tuple(r), n) for op, r, n in res.get("backward", [])]
    if bwd != [("all_gather", tp_ranks, nbytes)]:
        ops = [op for op, _, _ in bwd] or "no collective"
        return (
            f"{where}: backward made {ops}; ḡ's backward is ONE comm.all_gather of the "
            f"gradient blocks into [b, s, h] ({nbytes} bytes) over the tp group."
        )
    if res["mutated"]:
        return (
            f"{where}: the results are right, but forward changed its input x in place; an "
            "autograd Function must leave its inputs as they were."
        )
    return None


_CRASHES = (
    (
        r"invalid gradient at index 0 - got \[(.*)\] but expected shape compatible with",
        "backward returned a gradient of shape [{0}], not x's [b, s, h]: all-gather every "
        "rank's gradient block along the sequence (dim 1) back to the full sequence.",
    ),
    (
        r"incorrect number of gradients",
        "backward returns one gradient per input of forward: (grad_x, None), None for group.",
    ),
    (
        r"view size is not compatible with input tensor's size and stride",
        "x.view(...) failed: x may be a non-contiguous (transposed) tensor; use .reshape or "
        ".contiguous() first, or split along dim 1 and concatenate contiguous blocks.",
    ),
    (
        r"(Connection closed by peer|doesn't match expected size|Connection reset)",
        "a rank left a collective the others were in, or sizes differed between ranks: "
        "every rank of the tp group must make the same collectives with the same sizes.",
    ),
)


def _explain_crash(exc: RankFailedError) -> str:
    text = str(exc)
    local = local_collective_cause(text)
    for pattern, hint in _CRASHES:
        m = re.search(pattern, text)
        if m and not (local and "Connection" in pattern):
            return f"rank {exc.rank} raised: {hint.format(*m.groups())}"
    if isinstance(exc, CheckFailed):  # the course's message already names what happened
        return str(exc)
    last = [line for line in text.strip().splitlines() if line.strip()][-1]
    return f"your code raised on rank {exc.rank}: {last.strip()}"


def check_reduce_scatter_to_sequence(cls: type) -> None:
    """ḡ on worlds of 2, 3 (tp = world) and 4 (tp groups of 2), two dtypes and layouts."""
    for world, tp in SP_CASES:
        try:
            results = run_on_world(_sp_rank, world, cls, tp, hang_hint=SP_HANG_HINT)
        except RankFailedError as exc:
            raise CheckFailed(_explain_crash(exc)) from None
        for rank, cases in enumerate(results):
            for res in cases:
                problem = (
                    _diagnose_forward(res, rank, world)
                    or _diagnose_backward(res, rank, world)
                    or _diagnose_ledger(res, rank, world)
                )
                if problem:
                    fail(problem)
    passed(
        "ḡ keeps this rank's block of the tp group's sum (one reduce-scatter, input "
        "untouched) and all-gathers the gradient blocks in backward, on worlds of 2, 3 and 4, "
        "for transposed and contiguous inputs"
    )
