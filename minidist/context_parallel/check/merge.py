"""Lesson 15, exercise 1: the online-softmax merge."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...course.check import fail, passed
from ...course.guard import guarded
from ..ring import block_attention as _block_ref
from ..ring import merge as _merge_ref
from ..split import positions
from ._shared import NEG, _pair, _same, form_problem

# exp overflows above these: float32's e^88.7, float64's e^709.8
OVERFLOW = {torch.float32: 88.0, torch.float64: 709.0}


def _cases():
    """(o, lse, o_blk, lse_blk) cases: random, one side empty (-inf), both empty, large
    (beyond exp's range in each dtype), a side whose o is all zeros but whose lse is not."""
    g = torch.Generator().manual_seed(7)
    out = []
    for dtype in (torch.float64, torch.float32):
        for rows, dim in ((5, 4), (3, 8), (6, 2), (4, 16), (8, 3), (3, 5)):
            lse = torch.randn(2, rows, device="cpu", generator=g, dtype=torch.float64) * 3
            lse_blk = torch.randn(2, rows, device="cpu", generator=g, dtype=torch.float64) * 3
            lse[0, 0], lse_blk[0, 1], lse[1, 2], lse_blk[1, 2] = NEG, NEG, NEG, NEG
            lse_blk[1, 0] = 100.0  # large scores: e^100 overflows float32 unless shifted
            lse[0, 2] = 800.0 if dtype == torch.float64 else 95.0  # and e^800 float64
            o, o_blk = (
                torch.randn(2, rows, dim, device="cpu", generator=g, dtype=torch.float64)
                for _ in "ab"
            )
            o[lse == NEG], o_blk[lse_blk == NEG] = 0.0, 0.0
            o[1, 1] = 0.0  # an all-zero partial attention that has seen keys: lse counts
            out.append(tuple(t.to(dtype) for t in (o, lse, o_blk, lse_blk)))
    return out


def _call(fn, args, what: str, copy: bool = True):
    try:
        return fn(*[a.clone() if copy else a for a in args])
    except NotImplementedError:
        raise
    except Exception as exc:  # a learner's crash becomes a message
        hint = ""
        if "must match the size of tensor" in str(exc):
            hint = (
                " Likely cause: lse has one dimension less than o ([..., rows] against "
                "[..., rows, d]): weight o by e^(...).unsqueeze(-1)."
            )
        fail(f"{what} raised {type(exc).__name__}: {exc}.{hint}")


def _merge_diagnosis(case, o, lse) -> str | None:
    o1, l1, o2, l2 = case
    dtype = o1.dtype
    want_o, want_l = _merge_ref(o1, l1, o2, l2)
    if _same(o, want_o, dtype) and _same(lse, want_l, dtype):
        return None
    both_empty = (l1 == NEG) & (l2 == NEG)
    large = torch.maximum(l1, l2) > OVERFLOW[dtype]
    bad = torch.isnan(o).any(-1) | torch.isnan(lse) | torch.isinf(o).any(-1)
    overflowed = bad & large
    if overflowed.any() or (torch.isinf(lse) & ~torch.isinf(want_l) & large).any():
        big = float(torch.maximum(l1, l2)[large].max())
        return (
            f"merge gave inf or NaN in rows whose lse is large (up to {big:g}): e^lse "
            f"overflows {dtype} (e^{OVERFLOW[dtype]:g} is near its largest number), so "
            "e^lse + e^lse_blk is inf. Never exponentiate lse itself: lse' = "
            "torch.logaddexp(lse, lse_blk), and weight by e^(lse - lse'), at most 1."
        )
    if torch.isnan(o).any() or torch.isnan(lse).any():
        where = "rows where neither side has seen a key (both lse = -inf)"
        if not both_empty.any() or not (bad <= both_empty).all():
            where = "some rows"
        return (
            f"merge gave NaN in {where}: e^(lse - lse') with lse = lse' = -inf is e^NaN. "
            "Where lse' is -inf, subtract 0 instead (those rows stay o = 0, lse = -inf)."
        )
    empty = (o1 == 0).all(-1) & (l1 != NEG)
    if empty.any():
        as_empty = torch.where(empty, l2, want_l)
        if _same(lse, as_empty, dtype) and not _same(lse, want_l, dtype):
            return (
                "a row whose o is all zeros was taken as one that has seen no key: an "
                "attention can be 0 after keys (its lse is finite, and counts in the merge). "
                "A row has seen no key exactly when its lse is -inf."
            )
    if _same(o, o1 + o2, dtype):
        return (
            "o' = o + o_blk: the partial attentions were added without rescaling. Each is "
            "normalised by its own softmax sum; weight them by e^(lse - lse') and "
            "e^(lse_blk - lse'), their shares of the merged sum."
        )
    if _same(o, (o1 + o2) / 2, dtype):
        return (
            "o' is the plain average of the two partial attentions; weight each by its share "
            "of the merged softmax sum, e^(lse - lse') and e^(lse_blk - lse'), not 1/2."
        )
    if _same(lse, torch.maximum(l1, l2), dtype):
        return (
            "lse' = max(lse, lse_blk): that is the running MAX of a single-pass softmax, not "
            "the log-sum-exp of the union: lse' = log(e^lse + e^lse_blk) (torch.logaddexp)."
        )
    if _same(lse, l1 + l2, dtype):
        return "lse' = lse + lse_blk multiplies the two sums; the union's sum is e^lse + e^lse_blk."
    if (
        both_empty.any()
        and _same(lse.masked_fill(both_empty, NEG), want_l, dtype)
        and not _same(lse, want_l, dtype)
    ):
        return (
            "rows where neither side has seen a key must keep lse' = -inf (e^-inf = 0: no "
            "weight), not a finite value: a later block merged into them would be weighed wrong."
        )
    if not _same(lse, want_l, dtype):
        bad = ~torch.isclose(lse, want_l, equal_nan=True)
        return (
            f"lse' differs at {int(bad.sum())} of {bad.numel()} rows; lse' = "
            "log(e^lse + e^lse_blk), computed stably (torch.logaddexp)."
        )
    safe = want_l.masked_fill(want_l == NEG, 0.0)
    w1, w2 = torch.exp(l1 - safe).unsqueeze(-1), torch.exp(l2 - safe).unsqueeze(-1)
    if _same(o, o1 * w1 + o2, dtype) or _same(o, o1 + o2 * w2, dtype):
        side = "o_blk" if _same(o, o1 * w1 + o2, dtype) else "o"
        return (
            f"only one side was rescaled: {side} is added as it is. Both partial attentions "
            "get their weight: o·e^(lse - lse') + o_blk·e^(lse_blk - lse')."
        )
    if _same(o, o1 * w2 + o2 * w1, dtype):
        return (
            "the two weights are swapped: o goes with e^(lse - lse'), o_blk with "
            "e^(lse_blk - lse')."
        )
    if _same(o, o1 * torch.exp(safe - l1.clamp_min(-1e30)).unsqueeze(-1), dtype):
        return "the weights are inverted: e^(lse - lse'), not e^(lse' - lse)."
    e1, e2 = torch.exp(l1).unsqueeze(-1), torch.exp(l2).unsqueeze(-1)
    unshifted = torch.nan_to_num((o1 * e1 + o2 * e2) / (e1 + e2))
    if _same(o, unshifted, dtype):
        return (
            "o' is computed with e^lse itself, which overflows for large scores (e^100 is "
            "inf in float32): weight by e^(lse - lse'), at most 1, instead."
        )
    diff = (o - want_o).abs()
    idx = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
    return (
        f"lse' is right but o' differs at {int((diff > 1e-5).sum())} of {diff.numel()} "
        f"elements, most at {idx} (got {float(o[idx]):.6g}, want {float(want_o[idx]):.6g})."
    )


def _ring_fold(merge, c: int, layout: str) -> float:
    """Fold `merge` over every rank's key blocks in ring order; largest error vs torch."""
    g = torch.Generator().manual_seed(c)
    b, a, s, d = 2, 2, 4 * c, 4
    q, k, v = (
        torch.randn(b, a, s, d, device="cpu", generator=g, dtype=torch.float64) for _ in "qkv"
    )
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    worst = 0.0
    for r in range(c):
        qp = positions(s, c, r, layout)
        o = torch.zeros(b, a, len(qp), d, dtype=torch.float64, device="cpu")
        lse = torch.full((b, a, len(qp)), NEG, dtype=torch.float64, device="cpu")
        for step in range(c):
            kp = positions(s, c, (r - step) % c, layout)
            blk, blk_lse = _block_ref(q[:, :, qp], k[:, :, kp], v[:, :, kp], qp, kp, d**-0.5)
            o, lse = _pair(_call(merge, (o, lse, blk, blk_lse), "merge"), "merge")
        worst = max(worst, float((o - ref[:, :, qp]).abs().max()))
    return worst


def check_merge(merge) -> None:
    """The online-softmax merge on sampled cases, then folded over a ring of c = 2, 3, 4."""
    cases = _cases()
    for case in cases:
        got = _call(merge, case, "merge")
        want_o, want_l = _merge_ref(*case)
        where = f"on {case[0].dtype} inputs o {tuple(case[0].shape)}, lse {tuple(case[1].shape)}"
        problem = form_problem(got, want_o, want_l, f"merge {where}")
        if problem:
            fail(problem)
        o, lse = got
        wrong = f"merge {where}: (o', lse') differs from the merged attention"
        problem = guarded(_merge_diagnosis, wrong, case, o, lse)
        if problem:
            fail(problem)
    mutated = [t.clone() for t in cases[0]]
    _call(merge, mutated, "merge", copy=False)
    if not all(torch.equal(a, b) for a, b in zip(mutated, cases[0])):
        fail("merge changed its inputs in place; return new tensors (the caller keeps o, lse).")
    worst = max(_ring_fold(merge, c, lay) for c in (2, 3, 4) for lay in ("zigzag", "contiguous"))
    if worst > 1e-10:
        fail(f"folded over a ring, the attention differs from torch's by {worst:.3g}.")
    passed(
        f"the online-softmax merge on {len(cases)} sampled cases (float32 and float64, empty "
        "rows, all-zero partial attentions, scores beyond exp's range), and folded over rings "
        "of 2, 3 and 4 ranks (zig-zag and contiguous) equal to torch's causal attention"
    )
