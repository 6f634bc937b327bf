"""Exercise 2: the auxiliary load-balancing loss (Fedus et al. 2022, section 2.2, eq. 4-6)."""

from __future__ import annotations

import torch

from ...course.check import fail, passed
from ..routing import load_balancing_loss as _aux_ref
from ._shared import call


def _cases():
    """(probs, expert): float64 and float32, choices that are probs' argmax and choices that
    are not (sampled), T < E with unused experts, T ≠ E, and the two ends."""
    g = torch.Generator().manual_seed(61)
    out = []
    shapes = ((1, 2), (6, 4), (16, 8), (33, 3), (12, 4), (5, 8), (40, 2), (20, 6))
    for n, (t, e) in enumerate(shapes):
        dtype = torch.float32 if n % 3 == 2 else torch.float64
        logits = torch.randn(t, e, generator=g, dtype=torch.float64, device="cpu") * 2
        probs = torch.softmax(logits, -1).to(dtype)
        sampled = torch.multinomial(probs.double(), 1, generator=g).flatten()
        out.append((probs, probs.argmax(-1) if n % 2 == 0 else sampled))
    e = 4
    uniform = torch.full((8, e), 1 / e, dtype=torch.float64, device="cpu")
    out.append((uniform, torch.arange(8, device="cpu") % e))
    one = torch.zeros(8, e, dtype=torch.float64, device="cpu")
    one[:, 2] = 1.0
    out.append((one, torch.full((8,), 2, device="cpu")))
    return out


def _tol(dtype, loose: bool = False) -> dict:
    # float64: summation order only (~1e-16 relative), so that an f_e or P_e rounded to
    # float32 (~6e-8 relative) shows; float32: its own rounding. A mistake's prediction is
    # compared loosely (`loose`): the learner may compute it partly in float32.
    if dtype == torch.float64 and not loose:
        return {"rtol": 1e-10, "atol": 1e-13}
    return {"rtol": 1e-5, "atol": 1e-6}


def _gate_mass(probs, ids):
    e = probs.shape[-1]
    chosen = probs.gather(-1, ids[:, None]).squeeze(-1)
    zeros = torch.zeros(e, dtype=probs.dtype, device=probs.device)
    return zeros.index_add(0, ids, chosen) / ids.numel()


def _frac(probs, ids):
    e = probs.shape[-1]
    return torch.bincount(ids, minlength=e).to(probs.dtype) / ids.numel()


def _routed_mean(probs, ids):
    e = probs.shape[-1]
    counts = torch.bincount(ids, minlength=e).clamp_min(1).to(probs.dtype)
    return _gate_mass(probs, ids) * ids.numel() / counts


def _int_frac(probs, ids):
    return torch.bincount(ids, minlength=probs.shape[-1]) // ids.numel()


def _e(p):
    return p.shape[-1]


def _f32(x, like):
    """x rounded to float32 (the same rounding as computing it in float32), in like's dtype."""
    return x.float().to(like.dtype)


VALUES = {
    "the factor E is missing (or the sum over experts became a mean): E · Σ_e f_e · P_e, so "
    "that a uniform routing gives 1": lambda p, i: _aux_ref(p, i) / _e(p),
    "E appears twice: the loss is E · Σ_e f_e · P_e": lambda p, i: _aux_ref(p, i) * _e(p),
    "divided by E instead of multiplied: the loss is E · Σ_e f_e · P_e": lambda p, i: (
        _aux_ref(p, i) / _e(p) ** 2
    ),
    "P_e is the mean of ALL of probs (1/E), not of column e: P = probs.mean(0), one per "
    "expert": lambda p, i: _e(p) * (_frac(p, i) * p.mean()).sum(),
    "f_e = count / E: f_e is the fraction of the T tokens, count / T": lambda p, i: (
        _aux_ref(p, i) * i.numel() / _e(p)
    ),
    "T times too large: f_e and P_e are both MEANS over the T tokens (fractions), not counts "
    "or sums": lambda p, i: _aux_ref(p, i) * i.numel(),
    "T and E swapped: probs is [T, E] (tokens, experts), so T = probs.shape[0] and E = "
    "probs.shape[1]": lambda p, i: _aux_ref(p, i) * (i.numel() / _e(p)) ** 2,
    "f_e is the routed tokens' probability mass (gates), not the FRACTION of tokens routed to "
    "e (a count / T)": lambda p, i: _e(p) * (_gate_mass(p, i) * p.mean(0)).sum(),
    "f_e · f_e: the second factor is P_e, the mean router PROBABILITY of e (the only one with a "
    "gradient)": lambda p, i: _e(p) * (_frac(p, i) ** 2).sum(),
    "P_e · P_e: the first factor is f_e, the fraction of tokens routed to e": lambda p, i: (
        _e(p) * (p.mean(0) ** 2).sum()
    ),
    "P_e is averaged over the tokens routed to e only (the same as E · mean_t p[t, expert[t]]); "
    "average p_e over EVERY token": lambda p, i: _e(p) * (_frac(p, i) * _routed_mean(p, i)).sum(),
    "f_e counts probs.argmax(-1), not the choices given in `expert` (the checker also passes "
    "choices that are not the argmax)": lambda p, i: _aux_ref(p, p.argmax(-1)),
    "softmax applied to probs again: probs are already probabilities, P_e is their mean": (
        lambda p, i: _aux_ref(torch.softmax(p, -1), i)
    ),
    "f_e = count // T is an integer division (0 unless one expert takes every token): divide "
    "as floats": lambda p, i: _e(p) * (_int_frac(p, i) * p.mean(0)).sum(),
    "the coefficient α = 0.01 is inside: return the loss, the caller scales it": lambda p, i: (
        0.01 * _aux_ref(p, i)
    ),
}


# Rounding mistakes, compared tightly: right but for a float32 step in a float64 loss.
ROUNDING = {
    "f_e was computed in float32 (an int / int division such as (expert == e).sum() / T, or "
    ".float()) for float64 probs: its rounding (~1e-8) shows in a float64 loss. Compute it in "
    "probs' dtype: torch.bincount(expert, minlength=E).to(probs.dtype) / T": lambda p, i: (
        _e(p) * (_f32(_frac(p, i), p) * p.mean(0)).sum()
    ),
    "P_e was computed in float32 (probs.float()) for float64 probs: keep probs' dtype": (
        lambda p, i: _e(p) * (_frac(p, i) * _f32(p.mean(0), p)).sum()
    ),
}


def _close(a, b, dtype, loose: bool = False) -> bool:
    a, b = a.detach().double().reshape(b.shape), b.double()
    return bool(torch.allclose(a, b, **_tol(dtype, loose)))


def _run(loss, probs, ids):
    """(value, gradient or None) of the learner's loss on one case; fails on its form."""
    t, e = probs.shape
    what = f"load_balancing_loss(probs [{t}, {e}] {probs.dtype}, expert)"
    src = probs.detach().requires_grad_()
    got, (p, _) = call(loss, (src, ids), ("probs", "expert"), what)
    if not isinstance(got, torch.Tensor) or got.numel() != 1:
        form = tuple(got.shape) if isinstance(got, torch.Tensor) else ""
        fail(
            f"load_balancing_loss must return a one-element tensor; got {type(got).__name__}{form}."
        )
    if got.dtype != probs.dtype:
        fail(
            f"{what} returned a {got.dtype} tensor: return it in probs' dtype ({probs.dtype}); "
            "an f_e made with .float() or .double() changes it."
        )
    if not got.requires_grad:
        return got, None
    try:
        got.sum().backward()
    except RuntimeError as exc:
        fail(f"{what}: backward through your loss failed ({exc}).")
    return got, p.grad


def check_load_balancing_loss(loss) -> None:
    """E · Σ f_e · P_e: value and gradient on sampled routings and the two ends."""
    cases = _cases()
    runs = [_run(loss, probs, ids) for probs, ids in cases]
    wrong = [
        n
        for n, ((probs, ids), (got, _)) in enumerate(zip(cases, runs))
        if not _close(got, _aux_ref(probs, ids), probs.dtype)
    ]
    if wrong:
        tables = [(ROUNDING, False), (VALUES, True)]
        for (name, alt), loose in ((kv, loose) for table, loose in tables for kv in table.items()):
            if all(_close(g, alt(p, i), p.dtype, loose) for (p, i), (g, _) in zip(cases, runs)):
                fail(f"load_balancing_loss: {name}.")
        probs, ids = cases[wrong[0]]
        got, want = float(runs[wrong[0]][0].detach()), float(_aux_ref(probs, ids))
        ratio = f"; got/want = {got / want:.4g}" if want else ""
        fail(
            f"load_balancing_loss on {ids.numel()} token(s), E = {probs.shape[-1]}, expert "
            f"ids {ids.tolist()}: got {got:.6g}, want {want:.6g} (E · Σ_e f_e · P_e{ratio})."
        )
    for (probs, ids), (_, grad) in zip(cases, runs):
        if grad is None:
            fail(
                "load_balancing_loss: the value is right but no gradient reaches probs (was it "
                "detached, or computed in Python numbers?): the router learns from P_e."
            )
        t, e = probs.shape
        want = (e * _frac(probs, ids) / t).expand(t, e)
        if not _close(grad, want, probs.dtype):
            fail(
                "load_balancing_loss: the value is right but its gradient with respect to "
                "probs is not E · f_e / T: f_e must be a constant (counts), P_e a mean of "
                "probs."
            )
    passed(
        f"E · Σ f_e · P_e on {len(cases)} routings, float32 and float64 (value and gradient; "
        "uniform gives 1, all on one expert gives E)"
    )
