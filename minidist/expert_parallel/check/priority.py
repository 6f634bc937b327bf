"""Exercise 3: top-k slots and capacity, every first choice before any second (Lepikhin et
al. 2020, "GShard", section 2.2 and Algorithm 1)."""

from __future__ import annotations

import math

import torch

from ...course.check import fail, passed
from ...course.guard import guarded, tensor_form
from ..routing import route
from ._shared import call
from .dispatch import FACTORS


def _cases():
    """(experts [T, k], E, capacity factor): k = 1 to 3, E = 2 to 16, skewed, T < E."""
    g = torch.Generator().manual_seed(1602)
    out = []
    for i in range(36):
        k = 1 + i % 3
        e = max((2, 3, 4, 8, 5, 16)[i % 6], k)
        t = int(torch.randint(1, 41, (1,), generator=g, device="cpu"))
        skew = torch.rand(e, generator=g, device="cpu") ** (1 + i % 4)
        rows = [torch.multinomial(skew / skew.sum(), k, generator=g) for _ in range(t)]
        out.append((torch.stack(rows), e, FACTORS[i % len(FACTORS)]))
    out.append((torch.tensor([[0, 1]] * 6, device="cpu"), 4, 1.0))  # all on the same two
    return out


def _reference(experts, e, cf):
    """(slot, kept, C) of `routing.route` on logits that choose exactly `experts`."""
    t, k = experts.shape
    logits = torch.zeros(t, e, dtype=torch.float64, device=experts.device)
    rank = torch.arange(k, 0, -1, dtype=torch.float64, device=experts.device).expand(t, k)
    r = route(logits.scatter(1, experts, rank), k, cf)  # ranks k … 1 > 0: topk = experts
    return r.slot, r.kept, r.capacity


def _slots(order: torch.Tensor, e: int) -> torch.Tensor:
    """Each assignment's position among its expert's, in the given order [n] of expert ids."""
    onehot = torch.nn.functional.one_hot(order, e)
    return ((onehot.cumsum(0) - 1) * onehot).sum(-1)


def _token_major(x, e, cf):
    t, k = x.shape
    return _slots(x.reshape(-1), e).view(t, k), None


def _second_first(x, e, cf):
    t, k = x.shape
    return _slots(x.flip(1).t().reshape(-1), e).view(k, t).t().flip(1), None


def _per_choice(x, e, cf):
    return torch.stack([_slots(x[:, j], e) for j in range(x.shape[1])], 1), None


def _tokens_reversed(x, e, cf):
    return _slots(x.flip(0).t().reshape(-1), e).view(x.shape[1], -1).t().flip(0), None


def _cap(rule):
    return lambda x, e, cf: (_reference(x, e, cf)[0], rule(x.shape[0], x.shape[1], e, cf))


ALTERNATIVES = {
    "priority by token (token 0's choices, then token 1's, ...): GShard puts EVERY token's "
    "first choice before any second choice, so order the assignments choice by choice "
    "(experts.t().reshape(-1)), tokens in order within a choice": _token_major,
    "tokens in reverse order within a choice: within a choice, token 0 comes first": (
        _tokens_reversed
    ),
    "second choices before first choices: the first choices go first": _second_first,
    "each choice has its own count (slots restart at 0 for the second choices): the expert's "
    "buffer is shared by all choices, first choices first": _per_choice,
    "C = ⌈cf·T/E⌉: with k choices per token there are k·T assignments, C = ⌈cf·T·k/E⌉": _cap(
        lambda t, k, e, cf: math.ceil(cf * t / e)
    ),
    "C counts k twice: T is experts.shape[0] (experts.numel() is already T·k)": _cap(
        lambda t, k, e, cf: math.ceil(cf * t * k * k / e)
    ),
    "slots count from 1: an expert's first assignment has slot 0": lambda x, e, cf: (
        _reference(x, e, cf)[0] + 1,
        None,
    ),
    "C = ⌊cf·T·k/E⌋ (floor): the capacity rounds UP": _cap(
        lambda t, k, e, cf: math.floor(cf * t * k / e)
    ),
    "one assignment too many per expert (kept = slot <= C: C slots are 0 … C − 1)": _cap(
        lambda t, k, e, cf: math.ceil(cf * t * k / e) + 1
    ),
}


def _form(out, t: int, k: int):
    if not (isinstance(out, tuple | list) and len(out) == 2):
        n = f" of {len(out)}" if isinstance(out, tuple | list) else ""
        fail(f"priority must return a pair (slot, kept); it returned a {type(out).__name__}{n}.")
    slot, kept = out
    if isinstance(slot, torch.Tensor) and isinstance(kept, torch.Tensor):
        if slot.dtype == torch.bool and kept.dtype != torch.bool:
            fail("priority: (slot, kept) came back as (kept, slot): return slot first.")
    for name, x in (("slot", slot), ("kept", kept)):
        problem = tensor_form(x, name)
        if problem:
            fail(f"priority: {name} must be a tensor [T, k]: {problem}")
        if tuple(x.shape) != (t, k):
            fixed = (
                f" (k is experts.shape[1], here {k}: not a fixed number of choices)"
                if x.dim() == 2 and x.shape[0] == t
                else ""
            )
            fail(
                f"priority: {name} has shape {tuple(x.shape)}, want [T, k] = [{t}, {k}] "
                f"(one entry per token and choice, like `experts`){fixed}."
            )
    if kept.dtype != torch.bool:
        fail(f"priority: kept has dtype {kept.dtype}; it is a mask: torch.bool (slot < C).")
    if slot.dtype != torch.int64:
        fail(
            f"priority: slot has dtype {slot.dtype}; the exercise asks for int64 (torch.long, "
            "what indexes a buffer and what torch's own index ops return): .long() or "
            "dtype=torch.long."
        )
    return slot, kept


def _same(got, alt) -> bool:
    slot, kept = got
    a_slot, a_cap = alt
    if not torch.equal(slot, a_slot):
        return False
    return a_cap is None or torch.equal(kept, a_slot < a_cap)


def check_priority(priority) -> None:
    """Slots and capacity of top-k routing on sampled routings (k = 1 to 3); named mistakes."""
    cases = _cases()
    got = []
    for x, e, cf in cases:
        what = f"priority(experts [{x.shape[0]}, {x.shape[1]}], {e}, {cf})"
        names = ("experts", "num_experts", "capacity_factor")
        out, _ = call(priority, (x, e, cf), names, what, choices=True)
        got.append(_form(out, *x.shape))
    want = [_reference(x, e, cf) for x, e, cf in cases]
    bad = [
        i
        for i, ((s, k), (ws, wk, _)) in enumerate(zip(got, want))
        if not (torch.equal(s, ws) and torch.equal(k, wk))
    ]
    if not bad:
        drops = sum(int((~wk).sum()) for _, wk, _ in want)
        passed(
            f"slots and capacity on {len(cases)} sampled routings (k = 1 to 3, E = 2 to 16, "
            f"{drops} assignments dropped, first choices first)"
        )
        return
    for name, alt in ALTERNATIVES.items():
        if all(_same(g, alt(x, e, cf)) for g, (x, e, cf) in zip(got, cases)):
            fail(f"priority: {name}.")
    problem = guarded(
        lambda: _capacity_problem(cases, got, want) or _slot_problem(cases, got, want),
        "slots or kept differ from GShard's priority",
    )
    if problem:
        fail(f"priority: {problem}")
    i = min(bad, key=lambda n: cases[n][0].numel())  # the smallest wrong routing
    (x, e, cf), (slot, kept), (ws, wk, cap) = cases[i], got[i], want[i]
    where = f"on experts {x.tolist()} (E = {e}, capacity_factor = {cf}, C = {cap})"
    if torch.equal(slot, ws):
        fail(
            f"priority {where}: the slots are right but kept is not slot < C for any one C: "
            f"kept {kept.int().tolist()}, want {wk.int().tolist()}."
        )
    if torch.equal(slot[wk], ws[wk]) and (slot[~wk] < 0).all():
        fail(
            f"priority {where}: a dropped assignment's slot is its position in the expert's "
            "priority order (C or more), not a negative marker; kept says it is dropped."
        )
    t, j = (slot != ws).nonzero()[0].tolist()
    fail(
        f"priority {where}: token {t}'s choice {j} (expert {int(x[t, j])}) has slot "
        f"{int(slot[t, j])}, want {int(ws[t, j])} (slots {slot.tolist()}, want {ws.tolist()})."
    )


# Capacity rules a learner may use instead of ⌈cf·T·k/E⌉, each f(T, k, E, cf) -> C.
WRONG_CAPACITY = {
    "C = ⌈T·k/E⌉: the capacity_factor is missing": lambda t, k, e, cf: math.ceil(t * k / e),
    "C = (cf·T·k + E − 1) // E: that integer ceiling is ⌈x/E⌉ only for a whole x, and cf·T·k "
    "is not one (cf = 1.25, 0.75): use math.ceil(cf·T·k/E)": lambda t, k, e, cf: int(
        (cf * t * k + e - 1) // e
    ),
    "C = (T·k + E − 1) // E: the integer ceiling without the capacity_factor": lambda t, k, e, cf: (
        (t * k + e - 1) // e
    ),
    "C = round(cf·T·k/E): the capacity rounds UP": lambda t, k, e, cf: round(cf * t * k / e),
    "C = ⌈int(cf)·T·k/E⌉: the capacity_factor was truncated to an integer": lambda t, k, e, cf: (
        math.ceil(int(cf) * t * k / e)
    ),
    "C = ⌈cf·T·k⌉: divide by E, the assignments are shared by E experts": lambda t, k, e, cf: (
        math.ceil(cf * t * k)
    ),
}


def _capacity_problem(cases, got, want) -> str | None:
    """With every slot right: kept is slot < C' for one C' per routing, and C' is not C."""
    if not all(torch.equal(s, ws) for (s, _), (ws, _, _) in zip(got, want)):
        return None
    bounds = []  # per routing, the C' that fit: lo <= C' <= hi
    for slot, kept in got:
        lo = int(slot[kept].max()) + 1 if kept.any() else 0
        hi = int(slot[~kept].min()) if (~kept).any() else 10**9
        if lo > hi:
            return None  # not a threshold at all: the generic message says so
        bounds.append((lo, hi))
    for name, rule in WRONG_CAPACITY.items():
        if all(
            lo <= rule(x.shape[0], x.shape[1], e, cf) <= hi
            for (lo, hi), (x, e, cf) in zip(bounds, cases)
        ):
            return f"the slots are right and kept is slot < C, but your C is wrong: {name}."
    n = next(
        n for n, ((lo, hi), (_, _, cap)) in enumerate(zip(bounds, want)) if not lo <= cap <= hi
    )
    (x, e, cf), (lo, hi), cap = cases[n], bounds[n], want[n][2]
    yours = f"{lo}" if lo == hi else f"between {lo} and {hi}"
    return (
        f"the slots are right and kept is slot < C, but your C is wrong: on {x.shape[0]} tokens "
        f"with k = {x.shape[1]}, E = {e}, capacity_factor = {cf}, your C is {yours}, and C = "
        f"⌈cf·T·k/E⌉ = ⌈{cf * x.shape[0] * x.shape[1] / e:g}⌉ = {cap}."
    )


def _slot_problem(cases, got, want) -> str | None:
    """Slots clamped to C (or C − 1), or each expert's right slots in another order."""
    for clamp, label in ((0, "C"), (1, "C − 1")):
        if all(
            torch.equal(s, ws.clamp_max(cap - clamp)) and torch.equal(k, wk)
            for (s, k), (ws, wk, cap) in zip(got, want)
        ):
            return (
                f"a dropped assignment's slot is clamped to {label}: keep counting (the "
                "dropped ones' slots are C, C + 1, …, their places in the priority order; "
                "kept = slot < C says which are dropped)."
            )
    if all(torch.equal(s, ws) for (s, _), (ws, _, _) in zip(got, want)):
        return None
    for (s, _), (ws, _, _), (x, e, _) in zip(got, want, cases):
        for n in range(e):
            mine = x == n
            if sorted(s[mine].tolist()) != sorted(ws[mine].tolist()):
                return None
    return (
        "each expert's slots are the right numbers 0, 1, 2, … but given to its assignments in "
        "another order than GShard's priority (every first choice before any second, tokens "
        "in order within a choice): a sort that is not stable? torch.argsort and torch.sort "
        "reorder equal keys unless stable=True."
    )
