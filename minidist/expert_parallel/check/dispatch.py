"""Exercise 1: capacity-limited top-1 dispatch (Fedus et al. 2022, section 2.2, eq. 3)."""

from __future__ import annotations

import math
import numbers

import torch

from ...course.check import fail, passed
from ..routing import dispatch as _dispatch_ref
from ._shared import call

FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)  # binary fractions: cf·T/E has no rounding error


def _routings():
    """(expert ids, E, capacity factor): random, skewed, one expert, unused experts, T < E,
    many tokens and experts, an integer capacity factor."""
    g = torch.Generator().manual_seed(16)
    out = [
        (torch.tensor([0, 1, 0, 0, 2, 0, 1], device="cpu"), 3, 1.0),
        (torch.zeros(5, dtype=torch.long, device="cpu"), 1, 1.0),
    ]
    for i in range(44):
        e = (2, 3, 4, 8, 5, 16)[i % 6]
        t = int(torch.randint(1, 41 if e < 16 else 101, (1,), generator=g, device="cpu"))
        skew = torch.rand(e, generator=g, device="cpu") ** (1 + i % 3 * 2)  # rare experts
        ids = torch.multinomial(skew / skew.sum(), t, replacement=True, generator=g)
        out.append((ids, e, FACTORS[i % len(FACTORS)]))
    out += [
        (torch.full((9,), 2, dtype=torch.long, device="cpu"), 4, 1.0),
        (torch.arange(8, device="cpu") % 4, 4, 1.0),
        (torch.tensor([5, 1, 5], device="cpu"), 8, 1.0),  # T < E: C = 1
        (torch.tensor([1, 1, 0, 1, 1, 1, 0], device="cpu"), 2, 2),  # an int factor
    ]
    return out


def _with_capacity(cap):
    """The right dispatch with another capacity rule cap(T, E, cf, ids, expert)."""

    def fn(ids, e, cf):
        out = []
        for x in range(e):
            m = torch.nonzero(ids == x).flatten()
            c = max(cap(ids.numel(), e, cf, ids, m), 0)
            out.append((m[:c], m[c:]))
        return out

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
    ]


def _swapped(ids, e, cf):
    return [(d, k) for k, d in _dispatch_ref(ids, e, cf)]


ALTERNATIVES = {
    "the first C·E tokens are kept whatever their expert: each expert has its OWN capacity C, "
    "and keeps its first C tokens": _shared,
    "C = ⌊cf·T/E⌋ (floor): the capacity rounds UP, ⌈cf·T/E⌉, so that cf = 1 with a perfectly "
    "even routing drops nothing": _with_capacity(lambda t, e, cf, i, m: math.floor(cf * t / e)),
    "C = round(cf·T/E): the capacity rounds UP, ⌈cf·T/E⌉": _with_capacity(
        lambda t, e, cf, i, m: round(cf * t / e)
    ),
    "C = ⌈cf·T⌉: divide by E, the tokens are shared by E experts": _with_capacity(
        lambda t, e, cf, i, m: math.ceil(cf * t)
    ),
    "C = ⌈T/E⌉: the capacity_factor is missing": _with_capacity(
        lambda t, e, cf, i, m: math.ceil(t / e)
    ),
    "C = (cf·T + E − 1) // E: that integer ceiling is ⌈x/E⌉ only for a whole x, and cf·T is "
    "not one (cf = 1.25, 0.75): use math.ceil(cf·T/E)": _with_capacity(
        lambda t, e, cf, i, m: int((cf * t + e - 1) // e)
    ),
    "C = ⌈int(cf)·T/E⌉: the capacity_factor was truncated to an integer (cf = 1.25 is not "
    "1); keep it a float": _with_capacity(lambda t, e, cf, i, m: math.ceil(int(cf) * t / e)),
    "C is computed over the experts that got a token, not all E = num_experts (an expert "
    "with no token still has its buffer)": _with_capacity(
        lambda t, e, cf, i, m: math.ceil(cf * t / len(torch.unique(i)))
    ),
    "E was taken from the data (the largest expert id + 1): E is num_experts, the argument; "
    "experts above the largest id chosen still have their buffers": _with_capacity(
        lambda t, e, cf, i, m: math.ceil(cf * t / (int(i.max()) + 1))
    ),
    "C is computed from each expert's own number of tokens: C = ⌈cf·T/E⌉ with T ALL the "
    "tokens, the same for every expert": _with_capacity(
        lambda t, e, cf, i, m: math.ceil(cf * len(m) / e)
    ),
    "C = ⌊cf·T/E⌋ + 1: that is ⌈cf·T/E⌉ only when cf·T/E is not a whole number; use "
    "math.ceil": _with_capacity(lambda t, e, cf, i, m: int(cf * t // e) + 1),
    "nothing is dropped: each expert keeps at most C = ⌈cf·T/E⌉ tokens, its first C": (
        _with_capacity(lambda t, e, cf, i, m: t)
    ),
    "one token too many per expert (C + 1: a `<=` where `<` belongs?)": _with_capacity(
        lambda t, e, cf, i, m: math.ceil(cf * t / e) + 1
    ),
    "one token too few per expert (C - 1: a `<` where `<=` belongs?)": _with_capacity(
        lambda t, e, cf, i, m: math.ceil(cf * t / e) - 1
    ),
    "the LAST C tokens are kept: priority is token order, the first C tokens win": _last,
    "kept and dropped are swapped: each pair is (kept, dropped), the first C tokens first": (
        _swapped
    ),
}


def _indices(p, what: str) -> list[int]:
    """A tensor, array or list of token indices -> list of ints; fails naming the form."""
    if not isinstance(p, torch.Tensor) and hasattr(p, "__array__"):
        p = torch.as_tensor(p)
    if isinstance(p, torch.Tensor):
        if p.dtype == torch.bool:
            fail(
                f"{what} is a boolean mask over the tokens: return the INDICES of the tokens "
                "(torch.nonzero(mask).flatten())."
            )
        if p.is_floating_point() or p.is_complex():
            fail(
                f"{what} has dtype {p.dtype}: token indices are integers (int64), which can "
                "index the tokens' tensor."
            )
        if p.dim() != 1:
            fail(
                f"{what} has shape {tuple(p.shape)}: return a 1-D tensor [n] of indices "
                "(torch.nonzero returns [n, 1]: .flatten() it)."
            )
        return p.tolist()
    if not isinstance(p, list | tuple | range):
        fail(f"{what} must be a tensor or a list of token indices; got {type(p).__name__}.")
    vals = list(p)
    if vals and all(isinstance(v, bool) for v in vals):
        fail(f"{what} is a list of booleans (a mask): return the INDICES of the tokens.")
    bad = next((v for v in vals if isinstance(v, bool) or not _integral(v)), None)
    if bad is not None:
        fail(f"{what} holds {bad!r} ({type(bad).__name__}): it must hold token indices (ints).")
    return [int(v) for v in vals]


def _integral(v) -> bool:
    return isinstance(v, numbers.Integral) or (
        isinstance(v, torch.Tensor) and v.numel() == 1 and not v.is_floating_point()
    )


def _as_pairs(got, e: int, what: str):
    if not isinstance(got, list | tuple) or len(got) != e:
        n = len(got) if isinstance(got, list | tuple) else type(got).__name__
        fail(
            f"{what} must return a list of one (kept, dropped) pair per expert, E = {e} of "
            f"them, experts that got no token included; it returned {n}."
        )
    out = []
    for x, pair in enumerate(got):
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            fail(
                f"{what}: each expert's entry must be a pair (kept, dropped); expert {x}'s "
                f"is a {type(pair).__name__}."
            )
        names = ("kept", "dropped")
        out.append(tuple(_indices(p, f"{what}: expert {x}'s {n}") for p, n in zip(pair, names)))
    return out


def _lists(pairs):
    return [(list(map(int, k)), list(map(int, d))) for k, d in pairs]


def _where(ids, e, cf) -> str:
    c = math.ceil(cf * ids.numel() / e)
    return f"on {ids.numel()} tokens, E = {e}, capacity_factor = {cf} (C = {c}), expert ids " + (
        f"{ids.tolist()}"
    )


def _other_expert(got, ids) -> str | None:
    """A token that an expert keeps or drops though it chose another expert."""
    for x, (k, d) in enumerate(got):
        for t in k + d:
            if not 0 <= t < ids.numel():
                return f"expert {x} lists token {t}, but the tokens are 0 … {ids.numel() - 1}"
            if int(ids[t]) != x:
                return (
                    f"expert {x} lists token {t}, which chose expert {int(ids[t])}: a token "
                    "goes only to its own expert (a dropped one is not re-routed)"
                )
        if len(set(k + d)) < len(k + d):
            return f"expert {x} lists a token twice (in kept and dropped, or twice in one)"
    return None


def check_dispatch(dispatch) -> None:
    """Capacity-limited top-1 dispatch on sampled routings; named mistakes."""
    cases = _routings()
    got = []
    for ids, e, cf in cases:
        what = f"dispatch(expert of {ids.numel()} tokens, {e}, {cf})"
        out, _ = call(dispatch, (ids, e, cf), ("expert", "num_experts", "capacity_factor"), what)
        got.append(_as_pairs(out, e, "dispatch"))
    want = [_lists(_dispatch_ref(ids, e, cf)) for ids, e, cf in cases]
    if got == want:
        drops = sum(len(d) for w in want for _, d in w)
        passed(
            f"capacity-limited dispatch on {len(cases)} sampled routings (E = 1 to 16, up to "
            f"100 tokens, capacity factors 0.5 to 2, {drops} tokens dropped in all, in token "
            "order)"
        )
        return
    for name, alt in ALTERNATIVES.items():
        if all(g == _lists(alt(ids, e, cf)) for g, (ids, e, cf) in zip(got, cases)):
            fail(f"dispatch: {name}.")
    i = next(i for i, (g, w) in enumerate(zip(got, want)) if g != w)
    ids, e, cf = cases[i]
    where = _where(ids, e, cf)
    other = _other_expert(got[i], ids)
    if other:
        fail(f"dispatch {where}: {other}.")
    x = next(x for x in range(e) if got[i][x] != want[i][x])
    (gk, gd), (wk, wd) = got[i][x], want[i][x]
    if gk == wk:
        fail(
            f"dispatch {where}: expert {x} keeps the right tokens but drops {gd}, not {wd}: "
            "the dropped are its tokens after the first C, in token order."
        )
    if sorted(gk) == wk:
        fail(
            f"dispatch {where}: expert {x} keeps the right tokens in the wrong order {gk}: "
            "return them in token order (their priority)."
        )
    if sorted(gk + gd) == wk + wd != gk + gd:
        fail(
            f"dispatch {where}: expert {x} has the right tokens, taken in another order than "
            f"token order ({gk + gd}): an expert keeps its FIRST C tokens (an argsort? "
            "torch.argsort is not stable unless stable=True)."
        )
    fail(f"dispatch {where}: expert {x} keeps {gk}, it should keep {wk} (and drop {wd}).")
