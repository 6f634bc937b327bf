"""Lesson 07, exercise 2: which mistake a wrong vocab-parallel cross entropy makes, found by
running it on crafted one-token rows (3 ranks, a vocabulary of 12, 4 columns each).

A wrong answer can be written in many ways (the target logit shifted by M or not, M added
back or not), so its loss on the checker's cases need not equal any one predicted value.
What does not depend on the way it is written is *which logits count as the target* and
*which maximum each rank subtracts*. Here:

- Attribution: a row of zeros (every rank's maximum is 0, so a rank's own maximum and the
  global one agree) and the same row with one column c lowered by 1. The right loss changes
  by log((V - 1 + e^-1) / V), plus 1 when c is the target; whatever more it changes by is
  -1 per time column c was counted as the target. For targets at the first column of ranks
  0 and 1, in the middle of rank 1 and at the last column, this names the mask's mistake:
  clamped instead of masked, no start offset, the end of the range included (<=), or any
  other pattern, by column. Counted only on the rank that holds the target: the target
  logit never all-reduced.
- Maxima: rows where one rank holds a logit of 2 and the others only zeros. An answer right
  on every zero row and wrong here subtracts each rank's own maximum.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ...course.check import run_on_world
from ...runtime import RankFailedError, WorldTimeoutError
from .ce_messages import CE_MESSAGES, CE_PROBE_MESSAGES

PROBE_WORLD, PROBE_VOCAB = 3, 12
PROBE_PER = PROBE_VOCAB // PROBE_WORLD
# a range's first column (ranks 0 and 1), a middle one of rank 1 (ranks on both sides of
# it), the last column of all
PROBE_TARGETS = (0, PROBE_PER, PROBE_PER + PROBE_PER // 2, PROBE_VOCAB - 1)
LOWER = -1.0  # how much a probed column is lowered: every rank's maximum stays 0
PEAK = 2.0  # the one larger logit of a maxima row
PROBE_ATOL = 1e-4  # float32 logs of sums of 12 terms near 1; a miscount moves a loss by ~1


def _probe_rows() -> list[tuple[torch.Tensor, int]]:
    """(full row of V logits, target): per target a zero row, then the zero row with each
    column lowered; then the maxima rows (one larger logit on rank k, target on rank k + 1).
    No padding: the checker's own cases name padding mistakes whatever the formulation."""
    rows = []
    zero = torch.zeros(PROBE_VOCAB, device="cpu")
    for t in PROBE_TARGETS:
        rows.append((zero, t))
        for c in range(PROBE_VOCAB):
            row = zero.clone()
            row[c] = LOWER
            rows.append((row, t))
    for k in range(PROBE_WORLD):
        row = zero.clone()
        row[k * PROBE_PER + 1] = PEAK
        rows.append((row, ((k + 1) % PROBE_WORLD) * PROBE_PER + 2))
    return rows


def _probe_rank(fn: Callable) -> list[float]:
    rank = dist.get_rank()
    start = rank * PROBE_PER
    out = []
    for row, t in _probe_rows():
        logits = row[None, start : start + PROBE_PER].clone()
        loss = fn(logits, torch.tensor([t], device="cpu"), None, start, PROBE_VOCAB)
        out.append(float(torch.as_tensor(loss).detach().reshape(-1)[0]))
    return out


def _right(row: torch.Tensor, t: int) -> float:
    return float(F.cross_entropy(row[None], torch.tensor([t], device="cpu")))


def _counts(losses: list[float], at: int, t: int) -> dict[int, int] | None:
    """{column: times counted as the target} from the zero row at `at` and its lowered
    copies; None when the differences are not whole counts (the log-sum-exp is wrong)."""
    base = losses[at]
    if abs(base - _right(torch.zeros(PROBE_VOCAB, device="cpu"), t)) > PROBE_ATOL:
        return None
    lse_change = math.log((PROBE_VOCAB - 1 + math.e**LOWER) / PROBE_VOCAB)
    counts = {}
    for c in range(PROBE_VOCAB):
        n = -(losses[at + 1 + c] - base - lse_change) / LOWER
        if abs(n - round(n)) > 10 * PROBE_ATOL:
            return None
        if round(n):
            counts[c] = round(n)
    return counts


def _owner(c: int) -> int:
    return c // PROBE_PER


def _clamped(t: int) -> dict[int, int]:
    k = _owner(t)
    others = (r for r in range(PROBE_WORLD) if r != k)
    return {r * PROBE_PER + (PROBE_PER - 1 if r < k else 0): 1 for r in others} | {t: 1}


def _zero_index(t: int) -> dict[int, int]:
    return {r * PROBE_PER: 1 for r in range(PROBE_WORLD) if r != _owner(t)} | {t: 1}


def _no_offset(t: int) -> dict[int, int]:
    return {r * PROBE_PER + t: 1 for r in range(PROBE_WORLD)} if t < PROBE_PER else {}


def _end_included(seen: dict[int, dict[int, int]]) -> bool:
    """Right for every target except those at a range's start (rank k >= 1), which rank k-1
    also counted, at one column of its own."""
    for t, counts in seen.items():
        k, j = divmod(t, PROBE_PER)
        if j or not k:
            if counts != {t: 1}:
                return False
            continue
        extra = {c: n for c, n in counts.items() if c != t}
        if counts.get(t) != 1 or len(extra) != 1 or set(extra.values()) != {1}:
            return False
        if _owner(next(iter(extra))) != k - 1:
            return False
    return any(t % PROBE_PER == 0 and t for t in seen)


def _one_side(seen: dict[int, dict[int, int]]) -> str | None:
    """ "lower" when the only extra counts are first columns of ranks above the target's
    owner (the mask lacks local >= 0), "upper" when they are last columns of ranks below it
    (the mask lacks local < columns); None otherwise."""
    for side, at, beyond in (("lower", 0, 1), ("upper", PROBE_PER - 1, -1)):
        extras = [(t, c) for t, counts in seen.items() for c in counts if c != t]
        fits = all(
            counts.get(t) == 1
            and all(n == 1 for n in counts.values())
            and all(
                c % PROBE_PER == at and (_owner(c) - _owner(t)) * beyond > 0
                for c in counts
                if c != t
            )
            for t, counts in seen.items()
        )
        if fits and extras:
            return side
    return None


def _wrong_column(seen: dict[int, dict[int, int]]) -> bool:
    """Each target counted once, by the rank that holds it, but at another of its columns."""
    return any(counts != {t: 1} for t, counts in seen.items()) and all(
        len(counts) == 1 and set(counts.values()) == {1} and _owner(next(iter(counts))) == _owner(t)
        for t, counts in seen.items()
    )


def _show(counts: dict[int, int]) -> str:
    if not counts:
        return "no column"
    cols = [f"{c}" + (f" ({n} times)" if n != 1 else "") for c, n in counts.items()]
    return ("column " if len(cols) == 1 else "columns ") + ", ".join(cols)


def _diagnose(losses: list[list[float]]) -> str | None:
    rows = _probe_rows()
    where = (
        f"on crafted one-token rows (vocabulary {PROBE_VOCAB} on {PROBE_WORLD} ranks, "
        f"{PROBE_PER} columns each)"
    )
    starts = [i for i, (row, _) in enumerate(rows) if not row.any()]
    per_rank = [{rows[i][1]: _counts(ls, i, rows[i][1]) for i in starts} for ls in losses]
    if any(c is None for counts in per_rank for c in counts.values()):
        return None  # the log-sum-exp itself is wrong: the value checks say more
    if any(counts != per_rank[0] for counts in per_rank):
        owner_only = all(
            counts[t] == ({t: 1} if _owner(t) == r else {})
            for r, counts in enumerate(per_rank)
            for t in counts
        )
        if owner_only:
            return (
                f"{where}: only the rank that holds the target counted it: "
                + CE_MESSAGES["no_target_reduce"]
            )
        return None
    seen = per_rank[0]
    first_wrong = next((t for t, counts in seen.items() if counts != {t: 1}), None)
    if first_wrong is not None:
        t = first_wrong
        middle = next(  # a middle target of rank 1: ranks on both sides of it
            (u for u, c in seen.items() if c != {u: 1} and _owner(u) == 1 and u % PROBE_PER), t
        )
        shown = "; ".join(
            f"target {u} was counted at {_show(seen[u])}" for u in dict.fromkeys((t, middle))
        )
        for name, predict in (("clamp", _clamped), ("zero_index", _zero_index)):
            if all(counts == predict(u) for u, counts in seen.items()):
                text = CE_MESSAGES["unmasked_clamp" if name == "clamp" else "unmasked_zero"]
                return f"{where}: {shown}: {text}"
        if all(counts == _no_offset(u) for u, counts in seen.items()):
            return f"{where}: {shown}: " + CE_PROBE_MESSAGES["no_offset"].format(
                last=PROBE_PER - 1, per=PROBE_PER
            )
        if _end_included(seen):
            t = next(u for u in seen if u % PROBE_PER == 0 and u)
            shown = f"target {t} was counted at {_show(seen[t])}"
            return f"{where}: {shown}: " + CE_PROBE_MESSAGES["end_included"]
        side = _one_side(seen)
        if side:
            return f"{where}: {shown}: " + CE_PROBE_MESSAGES[f"{side}_end_unmasked"]
        if _wrong_column(seen):
            return f"{where}: {shown}: " + CE_PROBE_MESSAGES["wrong_column"]
        return f"{where}: {shown}: " + CE_PROBE_MESSAGES["miscounted"].format(target=t)
    peaks = [(i, row, t) for i, (row, t) in enumerate(rows) if row.max() > 0]
    for i, row, t in peaks:
        want = _right(row, t)
        got = [ls[i] for ls in losses]
        if all(abs(g - want) <= PROBE_ATOL for g in got):
            continue
        k = _owner(int(row.argmax()))
        return (
            f"{where}: right on every row whose ranks all have the same maximum (0), wrong "
            f"where rank {k} holds a logit of {PEAK:g} and the others only zeros (ranks "
            f"returned {', '.join(f'{g:.5g}' for g in got)}, want {want:.5g}): "
            + CE_MESSAGES["local_max"]
        )
    return None


def probe_cross_entropy(fn: Callable, hang_hint: str) -> str | None:
    """The mistake `fn` makes, found on the crafted rows, or None (no pattern, or it raised)."""
    try:
        losses = run_on_world(_probe_rank, PROBE_WORLD, fn, hang_hint=hang_hint)
    except (RankFailedError, WorldTimeoutError):
        return None
    return _diagnose(losses)
