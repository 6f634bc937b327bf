"""Lesson 14, exercise 1: what is wrong with a learner's ḡ, predicted from the inputs.

Each diagnosis computes what the learner's forward or backward would return under one
hypothesised mistake (all-reduce, the hidden dimension split, the world instead of the tp
group, ...) and names it only when that prediction matches; the ledger and the crash
messages name the collective that was (or was not) made.
"""

from __future__ import annotations

import math
import re

import torch

from ...course.check import CheckFailed, close
from ...course.failures import local_collective_cause
from ...runtime import RankFailedError

SP_SHAPE = (2, 12, 24)  # b, s, h: s and h divide by 2, 3 and 4, and differ


def _inputs(tp_rank: int, dtype, zero: int | None = None) -> torch.Tensor:
    """tp rank `tp_rank`'s partial output, [b, h, s] (the checker transposes it); all zeros
    on tp rank `zero`."""
    g = torch.Generator().manual_seed(100 + tp_rank)
    b, s, h = SP_SHAPE
    x = torch.randn(b, h, s, device="cpu", generator=g, dtype=torch.float64).to(dtype)
    return torch.zeros_like(x) if tp_rank == zero else x


def _upstream(tp_rank: int, t: int, dtype, zero: int | None = None) -> torch.Tensor:
    """The gradient block that reaches tp rank `tp_rank`'s output; all zeros on `zero`."""
    g = torch.Generator().manual_seed(200 + tp_rank)
    b, s, h = SP_SHAPE
    up = torch.randn(b, s // t, h, device="cpu", generator=g, dtype=torch.float64).to(dtype)
    return torch.zeros_like(up) if tp_rank == zero else up


def _block(t: torch.Tensor, k: int, n: int) -> torch.Tensor:
    size = t.shape[1] // n
    return t[:, k * size : (k + 1) * size]


def _diagnose_forward(res: dict, rank: int, world: int) -> str | None:
    tp_ranks, q, dtype = res["tp_ranks"], res["q"], res["dtype"]
    t = len(tp_ranks)
    b, s, h = SP_SHAPE
    zero = res.get("zero")
    mine = _inputs(q, dtype, zero).transpose(1, 2)
    total = sum(_inputs(j, dtype, zero).transpose(1, 2) for j in range(t))
    world_total = sum(_inputs(j % t, dtype, zero).transpose(1, 2) for j in range(world))
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
        raw = (
            torch.stack([_inputs(j, dtype, zero) for j in range(t)]).sum(0).reshape(-1).chunk(t)[q]
        )
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
    ups = [_upstream(j, t, dtype, res.get("zero")) for j in range(t)]
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
        r"returned a gradient different than None at position 2",
        "backward returned (None, grad): the gradients follow forward's inputs, (x, group): "
        "return (grad_x, None).",
    ),
    (
        r"expected (Variable|Tensor) or None \(got (\S+)\)",
        "backward returned a {1} for x's gradient: return a torch.Tensor (and None for group).",
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


def _wrong_group(text: str, world: int | None, tp: int | None) -> str | None:
    """A collective over the world where ḡ's belongs to its tp group, from its traces: a
    gradient [b, world·s/t, h], or a buffer that fits the world's size, not the group's."""
    if world is None or tp is None or world == tp:
        return None
    b, s, h = SP_SHAPE
    m = re.search(r"invalid gradient at index 0 - got \[(\d+), (\d+), (\d+)\]", text)
    if m and int(m.group(2)) == s // tp * world:
        return (
            f"backward returned a gradient of shape [{m.group(1)}, {m.group(2)}, "
            f"{m.group(3)}]: {world} blocks of {s // tp}, one per rank of the WORLD. Wrong "
            f"group: ḡ gathers over its tp group of {tp} ranks (ctx.group, saved in forward): "
            "dist.get_world_size(ctx.group) blocks, and group=ctx.group in comm.all_gather."
        )
    local = local_collective_cause(text) or ""
    pairs = r"\((\d+) vs\. (\d+)\)|expected \((\d+)\), got \((\d+)\)"
    found = [[n for n in m if n] for m in re.findall(pairs, text)] if local else []
    sizes = [int(n) for n in found[-1]] if found else []
    if sizes and max(sizes) * tp == min(sizes) * world:
        return (
            f"a collective's buffers fit a group of {tp} ({sizes[0]} vs. {sizes[1]} elements) "
            f"but it ran over the whole world of {world} ranks. Wrong group: pass "
            "group=group (group=ctx.group in backward) to every collective of ḡ."
        )
    return None


def _explain_crash(
    exc: RankFailedError, world: int | None = None, tp: int | None = None, extra: str = ""
) -> str:
    """The message for a world that failed: a wrong group first, then the crash patterns;
    `extra` is added to a message about collectives that did not match."""
    text = str(exc)
    group = _wrong_group(text, world, tp)
    if group:
        return f"rank {exc.rank}: {group}"
    local = local_collective_cause(text)
    message = None
    for pattern, hint in _CRASHES:
        m = re.search(pattern, text)
        if m and not (local and "Connection" in pattern):
            message = f"rank {exc.rank} raised: {hint.format(*m.groups())}"
            break
    if message is None and isinstance(exc, CheckFailed):  # already names what happened
        message = str(exc)
    if message is None:
        last = [line for line in text.strip().splitlines() if line.strip()][-1]
        message = f"your code raised on rank {exc.rank}: {last.strip()}"
    if extra and extra not in message and re.search(r"collective|waiting", message):
        message += " " + extra
    return message
