"""Checkers for the exercises of lesson 09 (pipeline parallelism). Pure functions: no world.

1. `check_one_f_one_b(one_f_one_b)`: `one_f_one_b(stage, stages, microbatches)` returns the
   ordered steps of one stage under 1F1B / PipeDream-Flush (Narayanan et al. 2021, section
   3.2): [("F", i), ("B", i), ...]. Compared with `schedule("1f1b", ...)` for several (p, m),
   m < p included, then every stage's list is run by the simulator: bubble
   (p-1)/(m+p-1) and at most min(p-r, m) micro-batches alive. Named mistakes: a warm-up of
   p-r forwards instead of p-r-1, backwards in reverse order, GPipe (all forwards first),
   the cool-down missing, steps missing or repeated, a backward before its forward.
2. `check_peak_microbatches(peak_microbatches)`: `peak_microbatches(stage, stages,
   microbatches, kind)` for kind "gpipe" and "1f1b": how many micro-batches' activations
   the stage holds at most (Huang et al. 2019; Narayanan et al. 2021). Compared with
   `theory.peak_microbatches` and the simulator's peak over a grid of (r, p, m). Named
   mistakes: the warm-up count p-r-1 (forgot the forward of the first steady step), no cap
   at m, stages counted from the end (r+1), GPipe's answer for 1F1B, 1F1B's for GPipe.
"""

from __future__ import annotations

from collections.abc import Callable

from ..course.check import fail, passed
from . import theory
from .schedules import schedule
from .simulate import simulate

SCHEDULE_CASES = ((4, 8), (4, 4), (4, 2), (2, 5), (3, 1))  # (p, m): m < p included


# -- exercise 1: one stage's 1F1B steps -------------------------------------------------------


def _reference(r: int, p: int, m: int) -> list[tuple]:
    return schedule("1f1b", p, m)[r]


def _with_warmup(warmup: int, m: int, reverse_backwards: bool = False) -> list[tuple]:
    warmup = min(warmup, m)
    order = list(range(m))[::-1] if reverse_backwards else list(range(m))
    steps = [("F", i) for i in range(warmup)]
    for k in range(m - warmup):
        steps += [("F", warmup + k), ("B", order[k])]
    return steps + [("B", order[k]) for k in range(m - warmup, m)]


def _diagnose_steps(got, r: int, p: int, m: int) -> str | None:
    where = f"stage {r} of p = {p}, m = {m}"
    right = _reference(r, p, m)
    if not isinstance(got, list | tuple):
        return f"{where}: one_f_one_b returned a {type(got).__name__}; return a list of tuples."
    try:
        got = [tuple(s) for s in got]
    except TypeError:
        return f"{where}: every step must be a tuple (op, microbatch), like ('F', 0)."
    if got == right:
        return None
    gpipe = [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    if got == gpipe:
        return (
            f"{where}: you returned GPipe's schedule, every forward before any backward: stage "
            f"{r} then holds all m = {m} micro-batches' activations. 1F1B runs only "
            f"min(p-r-1, m) = {min(p - r - 1, m)} forwards first, then alternates one forward "
            "and one backward, so at most p-r micro-batches are alive."
        )
    if got == _with_warmup(p - r, m) and got != right:
        return (
            f"{where}: your warm-up runs p-r = {p - r} forwards before the first backward; "
            f"1F1B's is p-r-1 = {p - r - 1}: the steady state's first forward is the p-r-th. "
            "One micro-batch too many stays alive on every stage."
        )
    if got == _with_warmup(p - r - 1, m, reverse_backwards=True):
        return (
            f"{where}: the backwards run in reverse order (micro-batch {m - 1} first); a stage "
            "can only backward micro-batch i once the next stage has sent i's gradient, and "
            "the last stage produces them in order 0, 1, 2...: backward the oldest first."
        )
    forwards = [s for s in got if s[0] == "F"]
    backwards = [s for s in got if s[0] == "B"]
    others = [s for s in got if s[0] not in ("F", "B")]
    if others:
        return f"{where}: steps {others[:3]} are neither ('F', i) nor ('B', i)."
    if sorted(forwards) == [("F", i) for i in range(m)] and len(backwards) < m:
        missing = sorted(set(range(m)) - {s[1] for s in backwards})
        return (
            f"{where}: the backwards of micro-batches {missing} are missing: after the steady "
            "state, the cool-down backwards the micro-batches still alive (as many as the "
            "warm-up forwarded)."
        )
    if sorted(got) != sorted(gpipe):
        return (
            f"{where}: every micro-batch 0..{m - 1} needs exactly one ('F', i) and one "
            f"('B', i); you returned {len(forwards)} forwards and {len(backwards)} backwards."
        )
    for i in range(m):
        if got.index(("B", i)) < got.index(("F", i)):
            return f"{where}: ('B', {i}) comes before ('F', {i}): a backward needs its forward."
    return (
        f"{where}: you returned {got}; 1F1B's steps are {right} (min(p-r-1, m) warm-up "
        "forwards, then one forward and one backward in turn, then the remaining backwards)."
    )


def check_one_f_one_b(one_f_one_b: Callable) -> None:
    """`one_f_one_b(stage, stages, microbatches)` against `schedule("1f1b", ...)`, simulated."""
    for p, m in SCHEDULE_CASES:
        stages = []
        for r in range(p):
            got = one_f_one_b(r, p, m)
            problem = _diagnose_steps(got, r, p, m)
            if problem:
                fail(problem)
            stages.append([tuple(s) for s in got])
        timeline = simulate(stages)
        bubble, formula = timeline.bubble, theory.bubble_fraction(p, m, "1f1b")
        peaks = timeline.peak_in_flight()
        want = [theory.peak_microbatches(r, p, m, "1f1b") for r in range(p)]
        if abs(bubble - formula) > 1e-9 or peaks != want:  # unreachable when the steps match
            fail(f"p = {p}, m = {m}: simulated bubble {bubble:.3f} (formula {formula:.3f}), "
                 f"peaks {peaks} (formula {want})")  # fmt: skip
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
        value = fn(*c, kind)
        if not isinstance(value, int) or isinstance(value, bool):
            return f"peak_microbatches{(*c, kind)} returned {value!r}; return an int."
        got[c] = value
    if got == right:
        return None
    wrong = [c for c in PEAK_CASES if got[c] != right[c]]
    r, p, m = wrong[0]
    example = (
        f"e.g. stage {r} of p = {p}, m = {m} ({kind}): you said {got[wrong[0]]}, "
        f"the simulator counts {right[wrong[0]]}."
    )
    if kind == "1f1b":
        if all(got[c] == c[2] for c in PEAK_CASES):
            return (
                f"for 1F1B you returned m, GPipe's answer: 1F1B starts backwards after the "
                f"warm-up, so stage r holds at most min(p-r, m). {example}"
            )
        if all(got[c] == min(c[1] - c[0] - 1, c[2]) for c in PEAK_CASES):
            return (
                "you returned the warm-up count min(p-r-1, m): the first steady step's forward "
                f"comes before its backward, so one more micro-batch is alive. {example}"
            )
        if all(got[c] == c[1] - c[0] for c in PEAK_CASES):
            return (
                "p-r is right only while m >= p-r: with fewer micro-batches than the warm-up "
                f"wants, a stage cannot hold more than m. Cap it: min(p-r, m). {example}"
            )
        if all(got[c] == min(c[0] + 1, c[2]) for c in PEAK_CASES):
            return (
                "you counted stages from the end: stage 0, the first, waits longest for its "
                f"first gradient and holds the most, p-r with r = 0. {example}"
            )
    elif all(got[c] == min(c[1] - c[0], c[2]) for c in PEAK_CASES):
        return (
            "for GPipe you returned 1F1B's answer: GPipe runs every forward before any "
            f"backward, so every stage holds all m micro-batches. {example}"
        )
    return f"{example} ({len(wrong)} of {len(PEAK_CASES)} cases differ.)"


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
