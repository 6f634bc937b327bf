"""Checkers for lesson 16's exercises (Fedus et al. 2021, Switch Transformer, section 2.2).

1. `check_dispatch(dispatch)`: `dispatch(expert, num_experts, capacity_factor)` takes each
   token's expert id (top-1) and returns, for each expert, (kept, dropped): the indices of
   its tokens it keeps and those it drops, both in token order; an expert keeps its first
   C = ⌈capacity_factor · T / E⌉ tokens. Checked on many sampled routings: E from 1 to 8,
   1 to 40 tokens, capacity factors 0.5 to 2, skewed and uniform routings, experts with no
   token, C·E exact and not.
2. `check_load_balancing_loss(loss)`: `loss(probs, expert)` returns E · Σ_e f_e · P_e, f_e
   the fraction of tokens whose expert is e, P_e the mean of the router probability of e
   over all tokens (a differentiable tensor): its value and its gradient with respect to
   probs, on sampled routings and on the two ends (uniform: 1, all on one expert: E).

Every catalogued mistake (`DISPATCH_MISTAKES`, `AUX_MISTAKES` in the tests) is named; for
anything else the checker says on which routing it differs and how.
"""

from __future__ import annotations

import math

import torch

from ..course.check import fail, passed
from .routing import dispatch as _dispatch_ref
from .routing import load_balancing_loss as _aux_ref

FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)  # binary fractions: cf·T/E has no rounding error


def _routings():
    """(expert ids, E, capacity factor): random, skewed, one expert, unused experts."""
    g = torch.Generator().manual_seed(16)
    out = [
        (torch.tensor([0, 1, 0, 0, 2, 0, 1], device="cpu"), 3, 1.0),
        (torch.zeros(5, dtype=torch.long, device="cpu"), 1, 1.0),
    ]
    for i in range(40):
        e = (2, 3, 4, 8)[i % 4]
        t = int(torch.randint(1, 41, (1,), generator=g, device="cpu"))
        skew = torch.rand(e, generator=g, device="cpu") ** (
            1 + i % 3 * 2
        )  # some experts rarely chosen
        ids = torch.multinomial(skew / skew.sum(), t, replacement=True, generator=g)
        out.append((ids, e, FACTORS[i % len(FACTORS)]))
    out += [
        (torch.full((9,), 2, dtype=torch.long, device="cpu"), 4, 1.0),
        (torch.arange(8, device="cpu") % 4, 4, 1.0),
    ]
    return out


def _with_capacity(cap):
    """The right dispatch with another capacity rule cap(T, E, cf)."""

    def fn(ids, e, cf):
        c = max(cap(ids.numel(), e, cf), 0)
        return [
            (m[:c], m[c:]) for m in (torch.nonzero(ids == x).flatten() for x in range(e))
        ]  # fmt: skip

    return fn


def _last(ids, e, cf):
    c = math.ceil(cf * ids.numel() / e)
    out = []
    for x in range(e):
        m = torch.nonzero(ids == x).flatten()
        out.append((m[max(len(m) - c, 0) :], m[: max(len(m) - c, 0)]))
    return out


def _shared(ids, e, cf):
    budget = math.ceil(cf * ids.numel() / e) * e
    return [
        (m[m < budget], m[m >= budget]) for m in (torch.nonzero(ids == x)[:, 0] for x in range(e))
    ]  # fmt: skip


DISPATCH_ALTERNATIVES = {
    "the first C·E tokens are kept whatever their expert: each expert has its OWN capacity C, "
    "and keeps its first C tokens": _shared,
    "C = ⌊cf·T/E⌋ (floor): the capacity rounds UP, ⌈cf·T/E⌉, so that cf = 1 with a perfectly "
    "even routing drops nothing": _with_capacity(lambda t, e, cf: math.floor(cf * t / e)),
    "C = round(cf·T/E): the capacity rounds UP, ⌈cf·T/E⌉": _with_capacity(
        lambda t, e, cf: round(cf * t / e)
    ),
    "C = ⌈cf·T⌉: divide by E, the tokens are shared by E experts": _with_capacity(
        lambda t, e, cf: math.ceil(cf * t)
    ),
    "C = ⌈T/E⌉: the capacity_factor is missing": _with_capacity(lambda t, e, cf: math.ceil(t / e)),
    "one token too many per expert (C + 1: a `<=` where `<` belongs?)": _with_capacity(
        lambda t, e, cf: math.ceil(cf * t / e) + 1
    ),
    "one token too few per expert (C - 1: a `<` where `<=` belongs?)": _with_capacity(
        lambda t, e, cf: math.ceil(cf * t / e) - 1
    ),
    "the LAST C tokens are kept: priority is token order, the first C tokens win": _last,
}


def _as_pairs(got, e: int, what: str):
    if not isinstance(got, list | tuple) or len(got) != e:
        n = len(got) if isinstance(got, list | tuple) else type(got).__name__
        fail(f"{what} must return one (kept, dropped) pair per expert ({e}); it returned {n}.")
    out = []
    for pair in got:
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            fail(f"{what}: each expert's entry must be a pair (kept, dropped).")
        out.append(tuple(torch.as_tensor(p, dtype=torch.long).flatten().tolist() for p in pair))
    return out


def _lists(pairs):
    return [(k.tolist(), d.tolist()) for k, d in pairs]


def _call(fn, args, what):
    try:
        return fn(*args)
    except NotImplementedError:
        raise
    except Exception as exc:  # a learner's crash becomes a message
        fail(f"{what} raised {type(exc).__name__}: {exc}")


def check_dispatch(dispatch) -> None:
    """Capacity-limited top-1 dispatch on sampled routings; named mistakes."""
    cases = _routings()
    got = [
        _as_pairs(_call(dispatch, (ids.clone(), e, cf), "dispatch"), e, "dispatch")
        for ids, e, cf in cases
    ]  # fmt: skip
    want = [_lists(_dispatch_ref(ids, e, cf)) for ids, e, cf in cases]
    if got == want:
        drops = sum(len(d) for w in want for _, d in w)
        passed(
            f"capacity-limited dispatch on {len(cases)} sampled routings (E = 1 to 8, "
            f"capacity factors 0.5 to 2, {drops} tokens dropped in all, in token order)"
        )
        return
    for name, alt in DISPATCH_ALTERNATIVES.items():
        if all(g == _lists(alt(ids, e, cf)) for g, (ids, e, cf) in zip(got, cases)):
            fail(f"dispatch: {name}.")
    i = next(i for i, (g, w) in enumerate(zip(got, want)) if g != w)
    ids, e, cf = cases[i]
    where = f"on {ids.numel()} tokens, E = {e}, capacity_factor = {cf} (C = " + (
        f"{math.ceil(cf * ids.numel() / e)}), expert ids {ids.tolist()}"
    )
    x = next(x for x in range(e) if got[i][x] != want[i][x])
    (gk, gd), (wk, wd) = got[i][x], want[i][x]
    if gk == wk:
        fail(f"dispatch {where}: expert {x} keeps the right tokens but drops {gd}, not {wd}: "
             "the dropped are its tokens after the first C, in token order.")  # fmt: skip
    if sorted(gk) == wk:
        fail(f"dispatch {where}: expert {x} keeps the right tokens in the wrong order {gk}: "
             "return them in token order (their priority).")  # fmt: skip
    fail(f"dispatch {where}: expert {x} keeps {gk}, it should keep {wk} (and drop {wd}).")


# -- exercise 2: the auxiliary load-balancing loss -------------------------------------------


def _aux_cases():
    g = torch.Generator().manual_seed(61)
    out = []
    for t, e in ((1, 2), (6, 4), (16, 8), (33, 3), (12, 4)):
        probs = torch.softmax(
            torch.randn(t, e, generator=g, dtype=torch.float64, device="cpu") * 2, -1
        )
        out.append((probs, probs.argmax(-1)))
    e = 4
    out.append(
        (
            torch.full((8, e), 1 / e, dtype=torch.float64, device="cpu"),
            torch.arange(8, device="cpu") % e,
        )
    )
    one = torch.zeros(8, e, dtype=torch.float64, device="cpu")
    one[:, 2] = 1.0
    out.append((one, torch.full((8,), 2, device="cpu")))
    return out


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


AUX_VALUES = {
    "the factor E is missing (or the sum over experts became a mean): E · Σ_e f_e · P_e, so "
    "that a uniform routing gives 1": lambda p, i: _aux_ref(p, i) / p.shape[-1],
    "E appears twice: the loss is E · Σ_e f_e · P_e": lambda p, i: _aux_ref(p, i) * p.shape[-1],
    "T times too large: f_e and P_e are both MEANS over the T tokens (fractions), not counts "
    "or sums": lambda p, i: _aux_ref(p, i) * i.numel(),
    "f_e is the routed tokens' probability mass (gates), not the FRACTION of tokens routed to "
    "e (a count / T)": lambda p, i: p.shape[-1] * (_gate_mass(p, i) * p.mean(0)).sum(),
    "f_e · f_e: the second factor is P_e, the mean router PROBABILITY of e (the only one with a "
    "gradient)": lambda p, i: p.shape[-1] * (_frac(p, i) ** 2).sum(),
    "P_e · P_e: the first factor is f_e, the fraction of tokens routed to e": lambda p, i: (
        p.shape[-1] * (p.mean(0) ** 2).sum()
    ),
    "P_e is averaged over the tokens routed to e only; average p_e over EVERY token": lambda p, i: (
        p.shape[-1] * (_frac(p, i) * _routed_mean(p, i)).sum()
    ),
    "the coefficient α = 0.01 is inside: return the loss, the caller scales it": lambda p, i: (
        0.01 * _aux_ref(p, i)
    ),
}


def check_load_balancing_loss(loss) -> None:
    """E · Σ f_e · P_e: value and gradient on sampled routings and the two ends."""
    cases = _aux_cases()
    for probs, ids in cases:
        p = probs.clone().requires_grad_()
        got = _call(loss, (p, ids.clone()), "load_balancing_loss")
        if not isinstance(got, torch.Tensor) or got.numel() != 1:
            fail(f"load_balancing_loss must return a one-element tensor; got {type(got).__name__}"
                 f"{tuple(got.shape) if isinstance(got, torch.Tensor) else ''}.")  # fmt: skip
        want = _aux_ref(probs, ids)
        if not torch.allclose(got.detach().double().reshape(()), want, rtol=1e-9, atol=1e-12):
            for name, alt in AUX_VALUES.items():
                if all(
                    torch.allclose(
                        torch.as_tensor(_call(loss, (q.clone(), j.clone()), "loss")).double()
                        .detach().reshape(()), alt(q, j), rtol=1e-9, atol=1e-12,
                    )
                    for q, j in cases
                ):  # fmt: skip
                    fail(f"load_balancing_loss: {name}.")
            fail(f"load_balancing_loss on {ids.numel()} tokens, E = {probs.shape[-1]}: got "
                 f"{float(got):.6g}, want {float(want):.6g} (E · Σ_e f_e · P_e).")  # fmt: skip
        if not got.requires_grad:
            fail(
                "load_balancing_loss: the value is right but no gradient reaches probs (was "
                "it detached, or computed in Python numbers?): the router learns from P_e."
            )
        got.sum().backward()
        e, t = probs.shape[-1], ids.numel()
        grad = (e * _frac(probs, ids) / t).expand(t, e)
        if p.grad is None or not torch.allclose(p.grad.double(), grad, rtol=1e-9, atol=1e-12):
            fail(
                "load_balancing_loss: the value is right but its gradient with respect to probs "
                "is not E · f_e / T: f_e must be a constant (counts), P_e a mean of probs."
            )
    passed(
        f"E · Σ f_e · P_e on {len(cases)} routings (value and gradient; uniform gives 1, all on "
        "one expert gives E)"
    )


__all__ = ["check_dispatch", "check_load_balancing_loss"]
