"""Checkers for the exercises of lesson 09 (pipeline parallelism). Pure functions: no world.

1. `check_one_f_one_b(one_f_one_b)`: `one_f_one_b(stage, stages, microbatches)` returns the
   ordered steps of one stage under 1F1B / PipeDream-Flush (Narayanan et al. 2021, section
   3.2): [("F", i), ("B", i), ...]. Compared with `schedule("1f1b", ...)` for several (p, m),
   m < p included, then every stage's list is run by the simulator: bubble
   (p-1)/(m+p-1) and at most min(p-r, m) micro-batches alive. Named mistakes
   (`check_mistakes.py`): a warm-up of p-r forwards instead of p-r-1, of r (stages counted
   from the end), of p-1 on every stage, not capped at m; backwards in reverse order; GPipe
   (all forwards first); the steady pair backward-first; micro-batches from 1; the
   cool-down missing; steps missing, repeated, strings or generators; a backward before its
   forward; the learner's own exception (`check_call.py`).
2. `check_peak_microbatches(peak_microbatches)`: `peak_microbatches(stage, stages,
   microbatches, kind)` for kind "gpipe" and "1f1b": how many micro-batches' activations
   the stage holds at most (Huang et al. 2019; Narayanan et al. 2021). Compared with
   `theory.peak_microbatches` and the simulator's peak over a grid of (r, p, m). Named
   mistakes: the warm-up count p-r-1 (forgot the forward of the first steady step), one too
   many, no cap at m, stages counted from the end (r+1), min(p, m) everywhere, GPipe's
   answer for 1F1B, 1F1B's for GPipe, GPipe capped at p or m-r; other answers say which
   stages differ, by how much, and whether only m <= p-r does.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable

from ..course.check import fail, passed
from . import theory
from .check_call import learner_call
from .check_mistakes import FAMILIES_1, FAMILIES_2, HINTS_1, HINTS_2
from .check_mistakes import reference as _reference
from .schedules import schedule
from .simulate import simulate

SCHEDULE_CASES = ((4, 8), (4, 4), (4, 2), (2, 5), (3, 1))  # (p, m): m < p included


# -- exercise 1: one stage's 1F1B steps -------------------------------------------------------


def _as_steps(got, where: str) -> list[tuple] | str:
    if not isinstance(got, list | tuple):
        kind = type(got).__name__
        return f"{where}: one_f_one_b returned a {kind}; return a list of tuples" + (
            " (list(...) of your generator)." if kind == "generator" else "."
        )
    if any(isinstance(s, str) for s in got):
        return f"{where}: a step is a tuple (op, microbatch) like ('F', 0), not a string."
    try:
        return [tuple(s) for s in got]
    except TypeError:
        return f"{where}: every step must be a tuple (op, microbatch), like ('F', 0)."


def _diagnose_steps(got: list[tuple], r: int, p: int, m: int) -> str | None:
    """One stage's steps (already tuples), when no whole-pipeline family matched."""
    where = f"stage {r} of p = {p}, m = {m}"
    right = _reference(r, p, m)
    if got == right:
        return None
    forwards = [s for s in got if s[0] == "F"]
    backwards = [s for s in got if s[0] == "B"]
    others = [s for s in got if s[0] not in ("F", "B")]
    if others:
        return f"{where}: steps {others[:3]} are neither ('F', i) nor ('B', i)."
    outside = [s for s in got if not (isinstance(s[1], int) and 0 <= s[1] < m)]
    if outside:
        return f"{where}: steps {outside[:3]} name micro-batches outside 0..{m - 1}" + (
            ": the warm-up must be capped at m, min(p-r-1, m)." if m < p - r - 1 else "."
        )
    if sorted(forwards) == [("F", i) for i in range(m)] and len(backwards) < m:
        missing = sorted(set(range(m)) - {s[1] for s in backwards})
        return (
            f"{where}: the backwards of micro-batches {missing} are missing: after the steady "
            "state, the cool-down backwards the micro-batches still alive (as many as the "
            "warm-up forwarded)."
        )
    if len(forwards) != m or len(backwards) != m or len(set(got)) != len(got):
        return (
            f"{where}: every micro-batch 0..{m - 1} needs exactly one ('F', i) and one "
            f"('B', i); you returned {len(forwards)} forwards and {len(backwards)} backwards"
            + (", some repeated." if len(set(got)) != len(got) else ".")
        )
    for i in range(m):
        if got.index(("B", i)) < got.index(("F", i)):
            return f"{where}: ('B', {i}) comes before ('F', {i}): a backward needs its forward."
    ahead = next(k for k, s in enumerate(got) if s[0] == "B")
    want = next(k for k, s in enumerate(right) if s[0] == "B")
    if ahead != want:
        return (
            f"{where}: your stage runs {ahead} forwards before its first backward; 1F1B runs "
            f"{want}: the warm-up min(p-r-1, m) = {min(p - r - 1, m)}"
            + (", plus the first steady step's forward." if want > min(p - r - 1, m) else ".")
            + f" You returned {got}."
        )
    k = next(k for k, (a, b) in enumerate(zip(got, right)) if a != b)
    return (
        f"{where}: the warm-up is right but step {k} differs: you run {got[k]}, 1F1B runs "
        f"{right[k]} (one forward and one backward in turn, then the remaining backwards, each "
        f"kind in micro-batch order). You returned {got}."
    )


def _diagnose_pipeline(one_f_one_b: Callable, p: int, m: int) -> str | list | None:
    stages = []
    for r in range(p):
        call = f"one_f_one_b({r}, {p}, {m})"
        got = _as_steps(
            learner_call(one_f_one_b, r, p, m, call=call, hints=HINTS_1),
            f"stage {r} of p = {p}, m = {m}",
        )
        if isinstance(got, str):
            return got
        stages.append(got)
    if all(stages[r] == _reference(r, p, m) for r in range(p)):
        return stages
    for _, family, message in FAMILIES_1:
        if all(stages[r] == [tuple(s) for s in family(r, p, m)] for r in range(p)):
            r = next(r for r in range(p) if stages[r] != _reference(r, p, m))
            return (
                f"p = {p}, m = {m}: {message} E.g. stage {r}: you returned {stages[r]}, "
                f"1F1B's is {_reference(r, p, m)}."
            )
    return next(d for r in range(p) if (d := _diagnose_steps(stages[r], r, p, m)))


def check_one_f_one_b(one_f_one_b: Callable) -> None:
    """`one_f_one_b(stage, stages, microbatches)` against `schedule("1f1b", ...)`, simulated."""
    for p, m in SCHEDULE_CASES:
        stages = _diagnose_pipeline(one_f_one_b, p, m)
        if isinstance(stages, str):
            fail(stages)
        timeline = simulate(stages)
        bubble, formula = timeline.bubble, theory.bubble_fraction(p, m, "1f1b")
        peaks = timeline.peak_in_flight()
        want = [theory.peak_microbatches(r, p, m, "1f1b") for r in range(p)]
        if abs(bubble - formula) > 1e-9 or peaks != want:  # unreachable when the steps match
            fail(
                f"p = {p}, m = {m}: simulated bubble {bubble:.3f} (formula {formula:.3f}), "
                f"peaks {peaks} (formula {want})"
            )
    p, m = 4, 8
    timeline = simulate([one_f_one_b(r, p, m) for r in range(p)])
    passed(
        f"one_f_one_b gives 1F1B's steps for every stage of {len(SCHEDULE_CASES)} pipelines; "
        f"simulated at p = {p}, m = {m}: bubble {timeline.bubble:.3f} = (p-1)/(m+p-1), "
        f"micro-batches alive per stage {timeline.peak_in_flight()} = min(p-r, m)"
    )


# -- exercise 2: how many micro-batches a stage holds ----------------------------------------

PEAK_CASES = [(r, p, m) for p in (2, 4, 8) for m in (1, 3, 4, 8, 16) for r in range(p)]


def _diagnose_peaks(fn: Callable, kind: str) -> str | None:
    right = {c: theory.peak_microbatches(*c, kind) for c in PEAK_CASES}
    got = {}
    for c in PEAK_CASES:
        value = learner_call(fn, *c, kind, call=f"peak_microbatches{(*c, kind)}", hints=HINTS_2)
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            return f"peak_microbatches{(*c, kind)} returned {value!r}; return an int."
        got[c] = int(value)
    if got == right:
        return None
    wrong = [c for c in PEAK_CASES if got[c] != right[c]]
    r, p, m = wrong[0]
    example = (
        f"e.g. stage {r} of p = {p}, m = {m} ({kind}): you said {got[wrong[0]]}, "
        f"the simulator counts {right[wrong[0]]}."
    )
    for family_kind, formula, message in FAMILIES_2:
        if family_kind == kind and all(got[c] == formula(*c) for c in PEAK_CASES):
            return f"{message} {example}"
    by = sorted({got[c] - right[c] for c in wrong})
    return (
        f"{example} {len(wrong)} of {len(PEAK_CASES)} cases differ, by {by[:5]} micro-batches"
        + (
            "; all of them with m <= p-r: look at the cap at m."
            if all(c[2] <= c[1] - c[0] for c in wrong)
            else f"; stages {sorted({c[0] for c in wrong})} are wrong."
        )
    )


def check_peak_microbatches(peak_microbatches: Callable) -> None:
    """`peak_microbatches(stage, stages, microbatches, kind)` for "gpipe" and "1f1b"."""
    for kind in ("gpipe", "1f1b"):
        problem = _diagnose_peaks(peak_microbatches, kind)
        if problem:
            fail(problem)
    for kind in ("gpipe", "1f1b"):  # the formula is what a schedule does: simulate it
        for p, m in ((4, 8), (4, 2)):
            sim = simulate(schedule(kind, p, m)).peak_in_flight()
            assert sim == [peak_microbatches(r, p, m, kind) for r in range(p)], (kind, p, m)
    passed(
        f"peak_microbatches matches the simulator for GPipe (m) and 1F1B (min(p-r, m)) on "
        f"{len(PEAK_CASES)} (stage, p, m) cases each; e.g. p = 4, m = 8: GPipe "
        f"{[peak_microbatches(r, 4, 8, 'gpipe') for r in range(4)]}, 1F1B "
        f"{[peak_microbatches(r, 4, 8, '1f1b') for r in range(4)]}"
    )
