"""The mistakes the lesson 09 checkers recognise (`check.py`), each a formula and its message.

`FAMILIES_1`: whole-pipeline mistakes of exercise 1 (the steps of every stage of a pipeline
under 1F1B, Narayanan et al. 2021, section 3.2, built by `with_warmup`); `FAMILIES_2`: the
mistakes of exercise 2 (micro-batches alive per stage, GPipe and 1F1B) as formulas of
(stage r, stages p, micro-batches m). `HINTS_*`: the likely cause of a learner's exception.
"""

from __future__ import annotations

from .schedules import schedule


def reference(r: int, p: int, m: int) -> list[tuple]:
    """Stage r's steps under 1F1B: the library's schedule."""
    return schedule("1f1b", p, m)[r]


HINTS_1 = {
    "IndexError": "an index computed from the stage or the warm-up count runs past a list "
    "(min(p-r-1, m) forwards, then m - warm-up steady steps)",
    "TypeError": "the arguments are (stage, stages, microbatches), three ints",
}


def _reference(r: int, p: int, m: int) -> list[tuple]:
    return schedule("1f1b", p, m)[r]


def with_warmup(
    warmup: int,
    m: int,
    reverse_backwards: bool = False,
    cap: bool = True,
    backward_first: bool = False,
    first: int = 0,
) -> list[tuple]:
    """1F1B's shape with another warm-up (capped at m or not), backwards in reverse order,
    the steady pair backward-first, or micro-batches numbered from `first`."""
    warmup = min(warmup, m) if cap else warmup
    order = list(range(m))[::-1] if reverse_backwards else list(range(m))
    steps = [("F", i) for i in range(warmup)]
    for k in range(m - warmup):
        pair = [("F", warmup + k), ("B", order[k])]
        steps += pair[::-1] if backward_first else pair
    steps += [("B", order[k] if k >= 0 else k) for k in range(m - warmup, m)]
    return [(op, i + first) for op, i in steps]


# Whole-pipeline mistakes: (name, steps of stage r of p with m micro-batches, message).
FAMILIES_1 = [
    (
        "gpipe",
        lambda r, p, m: [("F", i) for i in range(m)] + [("B", i) for i in range(m)],
        "you returned GPipe's schedule, every forward before any backward: stage 0 then holds "
        "all m micro-batches' activations. 1F1B runs only min(p-r-1, m) forwards first, then "
        "alternates one forward and one backward, so at most p-r micro-batches are alive.",
    ),
    (
        "warm-up p-r",
        lambda r, p, m: with_warmup(p - r, m),
        "your warm-up runs p-r forwards before the first backward; 1F1B's is p-r-1: the steady "
        "state's first forward is the p-r-th. One micro-batch too many stays alive on every "
        "stage.",
    ),
    (
        "reversed",
        lambda r, p, m: with_warmup(p - r - 1, m, reverse_backwards=True),
        "the backwards run in reverse order (micro-batch m-1 first); a stage can only backward "
        "micro-batch i once the next stage has sent i's gradient, and the last stage produces "
        "them in order 0, 1, 2...: backward the oldest first.",
    ),
    (
        "from the end",
        lambda r, p, m: with_warmup(r, m),
        "your warm-up is r forwards: you counted stages from the end. Stage 0, the first, waits "
        "longest for its first gradient and warms up the most, p-r-1 forwards; the last stage, "
        "r = p-1, none.",
    ),
    (
        "p-1 everywhere",
        lambda r, p, m: with_warmup(p - 1, m),
        "every stage warms up p-1 forwards: only stage 0 waits that long. Stage r's first "
        "gradient comes back after the p-r-1 stages behind it have forwarded: min(p-r-1, m).",
    ),
    (
        "uncapped",
        lambda r, p, m: with_warmup(p - r - 1, m, cap=False),
        "with fewer micro-batches than stages your warm-up forwards micro-batches that do not "
        "exist: cap it, min(p-r-1, m).",
    ),
    (
        "backward first",
        lambda r, p, m: with_warmup(p - r - 1, m, backward_first=True),
        "your steady state runs the backward before the forward of each pair: after the warm-up "
        "the next step is the forward of micro-batch warm-up + k, then the backward of k (the "
        "last stage must forward micro-batch 0 before it can backward it).",
    ),
    (
        "from 1",
        lambda r, p, m: with_warmup(p - r - 1, m, first=1),
        "your micro-batches are numbered 1..m; the schedule's are 0..m-1 (('F', 0) is the first).",
    ),
]


HINTS_2 = {"TypeError": "the arguments are (stage, stages, microbatches, kind), kind a str"}

# Whole-grid mistakes: (kind, the wrong formula, message).
FAMILIES_2 = [
    (
        "1f1b",
        lambda r, p, m: m,
        "for 1F1B you returned m, GPipe's answer: 1F1B starts backwards after the warm-up, so "
        "stage r holds at most min(p-r, m).",
    ),
    (
        "1f1b",
        lambda r, p, m: min(p - r - 1, m),
        "you returned the warm-up count min(p-r-1, m): the first steady step's forward comes "
        "before its backward, so one more micro-batch is alive.",
    ),
    (
        "1f1b",
        lambda r, p, m: p - r,
        "p-r is right only while m >= p-r: with fewer micro-batches than the warm-up wants, a "
        "stage cannot hold more than m. Cap it: min(p-r, m).",
    ),
    (
        "1f1b",
        lambda r, p, m: min(r + 1, m),
        "you counted stages from the end: stage 0, the first, waits longest for its first "
        "gradient and holds the most, p-r with r = 0.",
    ),
    (
        "1f1b",
        lambda r, p, m: min(p, m),
        "you returned min(p, m) on every stage: that is stage 0's count only. Stage r has p-r-1 "
        "stages behind it, so it holds min(p-r, m).",
    ),
    (
        "1f1b",
        lambda r, p, m: min(p - r + 1, m),
        "one too many: stage r holds its p-r-1 warm-up forwards plus the first steady "
        "forward, min(p-r, m), not min(p-r+1, m).",
    ),
    (
        "gpipe",
        lambda r, p, m: min(p - r, m),
        "for GPipe you returned 1F1B's answer: GPipe runs every forward before any backward, "
        "so every stage holds all m micro-batches (check how you compare `kind`: 'gpipe', "
        "lower case).",
    ),
    (
        "gpipe",
        lambda r, p, m: min(p, m),
        "for GPipe you capped at p: GPipe holds all m micro-batches whatever the depth, since "
        "every forward runs before the first backward.",
    ),
    (
        "gpipe",
        lambda r, p, m: m - r,
        "for GPipe every stage, the last included, forwards all m micro-batches before the "
        "first backward reaches it: m on every stage, not m-r.",
    ),
]
