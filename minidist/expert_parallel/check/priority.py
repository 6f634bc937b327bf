"""Exercise 3: top-k slots and capacity, every first choice before any second (Lepikhin et
al. 2020, "GShard", section 2.2 and Algorithm 1)."""

from __future__ import annotations

import math

import torch

from ...course.check import fail, passed
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
        fail(f"priority must return a pair (slot, kept); it returned {type(out).__name__}.")
    slot, kept = out
    if isinstance(slot, torch.Tensor) and isinstance(kept, torch.Tensor):
        if slot.dtype == torch.bool and kept.dtype != torch.bool:
            fail("priority: (slot, kept) came back as (kept, slot): return slot first.")
    for name, x in (("slot", slot), ("kept", kept)):
        if not isinstance(x, torch.Tensor):
            fail(f"priority: {name} must be a tensor [T, k]; got {type(x).__name__}.")
        if tuple(x.shape) != (t, k):
            fail(f"priority: {name} has shape {tuple(x.shape)}, want [T, k] = [{t}, {k}] "
                 "(one entry per token and choice, like `experts`).")  # fmt: skip
    if kept.dtype != torch.bool:
        fail(f"priority: kept has dtype {kept.dtype}; it is a mask: torch.bool (slot < C).")
    if slot.dtype not in (torch.int64, torch.int32):
        fail(f"priority: slot has dtype {slot.dtype}; buffer positions are integers (int64).")
    return slot.long(), kept


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
        out, _ = call(priority, (x, e, cf), ("experts", "num_experts", "capacity_factor"), what)
        got.append(_form(out, *x.shape))
    want = [_reference(x, e, cf) for x, e, cf in cases]
    bad = [
        i for i, ((s, k), (ws, wk, _)) in enumerate(zip(got, want))
        if not (torch.equal(s, ws) and torch.equal(k, wk))
    ]  # fmt: skip
    if not bad:
        drops = sum(int((~wk).sum()) for _, wk, _ in want)
        passed(f"slots and capacity on {len(cases)} sampled routings (k = 1 to 3, E = 2 to 16, "
               f"{drops} assignments dropped, first choices first)")  # fmt: skip
        return
    for name, alt in ALTERNATIVES.items():
        if all(_same(g, alt(x, e, cf)) for g, (x, e, cf) in zip(got, cases)):
            fail(f"priority: {name}.")
    i = min(bad, key=lambda n: cases[n][0].numel())  # the smallest wrong routing
    (x, e, cf), (slot, kept), (ws, wk, cap) = cases[i], got[i], want[i]
    where = f"on experts {x.tolist()} (E = {e}, capacity_factor = {cf}, C = {cap})"
    if torch.equal(slot, ws):
        fail(f"priority {where}: the slots are right but kept is not slot < C: "
             f"kept {kept.int().tolist()}, want {wk.int().tolist()}.")  # fmt: skip
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
