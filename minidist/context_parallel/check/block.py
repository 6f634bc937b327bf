"""Lesson 15, exercise 2: one key block's attention, masked by global positions."""

from __future__ import annotations

import torch

from ...course.check import fail, passed
from ...course.guard import guarded
from ..ring import block_attention as _block_ref
from ..split import positions
from ._shared import NEG, _same, form_problem

OVERFLOW = {torch.float32: 88.0, torch.float64: 709.0}  # exp(x) is inf above these


def _block_cases():
    """(q, k, v, q_pos, k_pos, scale): every (query rank, key rank) pair of zig-zag splits
    at c = 2 and 3 (blocks fully seen, partly seen, the diagonal, not at all), in float64
    and float32; then blocks of unequal lengths at scattered positions, all-zero queries,
    and scores beyond exp's range in each dtype (about 120 in float32, 900 in float64)."""
    g = torch.Generator().manual_seed(11)
    out = []
    for c, dtype in ((2, torch.float64), (3, torch.float64), (2, torch.float32)):
        s, d = 4 * c, 4
        q, k, v = (
            torch.randn(2, 2, s, d, device="cpu", generator=g, dtype=torch.float64) for _ in "qkv"
        )
        for r in range(c):
            for j in range(c):
                qp, kp = positions(s, c, r, "zigzag"), positions(s, c, j, "zigzag")
                out.append(_case(q[:, :, qp], k[:, :, kp], v[:, :, kp], qp, kp, d, dtype))
    for dtype, big in ((torch.float64, 900.0), (torch.float32, 120.0)):
        for rows, keys, d, zero, peak in ((3, 5, 4, False, big), (5, 2, 8, True, 0.0)):
            q, k, v = (
                torch.randn(2, n, d, device="cpu", generator=g, dtype=torch.float64)
                for n in (rows, keys, keys)
            )
            qp = torch.randperm(12, generator=g, device="cpu")[:rows].sort().values
            kp = torch.randperm(12, generator=g, device="cpu")[:keys].sort().values
            if zero:
                q = torch.zeros_like(q)
            if peak:  # one row's scores all near `peak`: exp(peak) overflows
                q = q * 0.1
                q[:, -1] = k[:, 0] * peak * d**0.5 / float((k[:, 0] ** 2).sum(-1).max())
                qp[-1] = 11
            out.append(_case(q, k, v, qp, kp, d, dtype))
    return out


def _case(q, k, v, qp, kp, d, dtype):
    return q.to(dtype), k.to(dtype), v.to(dtype), qp, kp, d**-0.5


def _where(case) -> str:
    q, k, v, qp, kp, scale = case
    return f"{q.dtype} q {tuple(q.shape)}, queries at positions {qp.tolist()}, keys at " + (
        f"{kp.tolist()}"
    )


def _block_diagnosis(case, o, lse) -> str | None:
    q, k, v, qp, kp, scale = case
    want_o, want_l = _block_ref(q, k, v, qp, kp, scale)
    dt = q.dtype
    where = _where(case)
    if _same(o, want_o, dt) and _same(lse, want_l, dt):
        return None
    scores = (q @ k.transpose(-2, -1)) * scale
    masked = kp[None, :] > qp[:, None]
    seen = torch.isfinite(want_l)
    top = scores.masked_fill(masked, NEG).max(-1).values
    large = seen & (top > OVERFLOW[dt])
    rest_right = _same(o[~large], want_o[~large], dt) and _same(lse[~large], want_l[~large], dt)
    if large.any() and rest_right:
        return (
            f"{where}: rows whose scores reach {float(top[large].max()):g} are wrong (the "
            f"others are right): exp of such a score overflows {dt} (its exp is inf above about "
            f"{OVERFLOW[dt]:g}). Subtract each row's max (or its log-sum-exp) from the scores "
            "before exp: softmax(S) = exp(S - max) / Σ exp(S - max), lse = max + log Σ exp(S - "
            "max) (torch.logsumexp does this)."
        )
    if torch.isnan(o).any() or torch.isnan(lse).any():
        nan_rows = torch.isnan(o).any(-1) | torch.isnan(lse)
        if (nan_rows <= ~seen).all():
            return (
                f"{where}: NaN in rows that see no key of this block (every score masked to "
                "-inf): give them o = 0 and lse = -inf (subtract 0, not -inf, before exp)."
            )
        return f"{where}: NaN in rows that see keys of this block; o and lse must be finite there."
    local_q, local_k = torch.arange(len(qp), device="cpu"), torch.arange(len(kp), device="cpu")
    for name, args in (
        (
            "the LOCAL indices 0..n-1 instead of the global positions q_pos, k_pos",
            (local_q, local_k),
        ),
        ("k_pos < q_pos: the diagonal (a token seeing itself) is masked out", (qp, kp + 0.5)),
    ):
        alt_o, alt_l = _block_ref(q, k, v, args[0], args[1], scale)
        if _same(o, alt_o, dt) and _same(lse, alt_l, dt):
            return f"{where}: your mask uses {name}."
    anti = _anti_causal(q, k, v, qp, kp, scale)
    if _same(o, anti[0], dt):
        return f"{where}: your mask is the wrong way round: a key is seen when k_pos <= q_pos."
    full = _block_ref(q, k, v, qp, torch.full_like(kp, -1), scale)
    if _same(o, full[0], dt) and not _same(o, want_o, dt):
        return f"{where}: no causal mask at all: mask scores where k_pos > q_pos to -inf."
    o_right = _same(o, want_o, dt)
    finite_fill = _fill(scores, masked, -1e9, v)
    if not o_right and _same(o, finite_fill[0], dt):
        return (
            f"{where}: masked scores set to a large negative number, not -inf: a row that "
            "sees no key of the block gets a plain average of V instead of o = 0, lse = -inf."
        )
    if not o_right and _same(o, _fill(scores, masked, 0.0, v)[0], dt):
        return f"{where}: masked scores set to 0, not -inf: a masked key still gets weight e^0."
    if not o_right and _same(o, torch.exp(scores.masked_fill(masked, NEG)) @ v, dt):
        return f"{where}: o = e^S·V is not normalised: divide by the row's Σ e^S (e^lse)."
    if o_right and _same(lse, torch.logsumexp(scores, -1), dt):
        return f"{where}: lse was taken over all the block's keys, before the mask: mask first."
    for name, sc in (
        ("no 1/√d scale", 1.0),
        ("1/d instead of 1/√d", scale * scale),
        ("a division by the scale (×√d) instead of a multiplication", 1 / scale),
    ):
        alt_o, alt_l = _block_ref(q, k, v, qp, kp, sc)
        if _same(o, alt_o, dt):
            return f"{where}: the scores use {name}: multiply QKᵀ by scale (1/√d, given)."
    if _same(o, want_o, dt):
        seen = torch.isfinite(want_l)
        mx = ((q @ k.transpose(-2, -1)) * scale).masked_fill(kp[None, :] > qp[:, None], NEG)
        if _same(lse[seen], mx.max(-1).values[seen], dt):
            return f"{where}: o is right but lse is the row MAX; return the log-sum-exp."
        return f"{where}: o is right but lse differs: return logsumexp of the masked scores."
    diff = (o - want_o).abs()
    return f"{where}: o differs by up to {float(diff.max()):.3g} from the block's attention."


def _fill(scores, masked, value: float, v):
    filled = scores.masked_fill(masked, value)
    lse = torch.logsumexp(filled, -1)
    return torch.exp(filled - lse.unsqueeze(-1)) @ v, lse


def _anti_causal(q, k, v, qp, kp, scale):
    scores = (q @ k.transpose(-2, -1)) * scale
    scores = scores.masked_fill(kp[None, :] < qp[:, None], NEG)
    lse = torch.logsumexp(scores, -1)
    safe = lse.masked_fill(lse == NEG, 0.0)
    return torch.exp(scores - safe.unsqueeze(-1)) @ v, lse


def check_block_attention(block_attention) -> None:
    """One key block's causal attention on zig-zag block pairs of c = 2 and 3, scattered
    positions, all-zero queries and large scores, in float64 and float32."""
    cases = _block_cases()
    for case in cases:
        got = _run_block(block_attention, case)
        want_o, want_l = _block_ref(*case)
        problem = form_problem(got, want_o, want_l, _where(case))
        if problem:
            fail(problem)
        wrong = f"{_where(case)}: (o, lse) differs from the block's attention"
        problem = guarded(_block_diagnosis, wrong, case, *got)
        if problem:
            fail(problem)
    args = [t.clone() for t in cases[0][:5]]
    _run_block(block_attention, (*args, cases[0][5]), copy=False)
    if not all(torch.equal(a, b) for a, b in zip(args, cases[0][:5])):
        fail(
            "block_attention changed its inputs in place: the ring reuses the same q for "
            "every key block, so an in-place scale or mask compounds. Return new tensors."
        )
    passed(
        f"one block's causal attention on {len(cases)} blocks (zig-zag pairs of c = 2 and 3, "
        "scattered positions, all-zero queries, scores beyond exp's range; float64 and "
        "float32): fully seen, the diagonal, and unseen blocks (o = 0, lse = -inf)"
    )


def _run_block(fn, case, copy: bool = True):
    q, k, v, qp, kp, scale = case
    args = (q, k, v, qp, kp)
    try:
        return fn(*[a.clone() if copy else a for a in args], scale)
    except NotImplementedError:
        raise
    except Exception as exc:
        fail(f"block_attention raised {type(exc).__name__}: {exc}")
