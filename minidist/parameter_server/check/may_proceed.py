"""Checker of exercise 1 of lesson 12: SSP's admission rule, `may_proceed(worker_clock,
clocks, staleness)` (Ho et al. 2013), against the server's `pull_bound`, then simulated."""

from __future__ import annotations

import itertools
from collections.abc import Callable

from ...course.check import fail, passed
from ...pipeline.check_call import learner_call
from ..server import pull_bound

# -- exercise 1: SSP's admission rule ---------------------------------------------------------

WORKERS = 3
# Every distinct (worker clock, clocks, s): a worker's clock is one of the clocks (two workers
# at the same clock give the same case once).
CLOCK_CASES = list(
    dict.fromkeys(
        (clocks[w], clocks, s)
        for clocks in itertools.product(range(5), repeat=WORKERS)
        for w in range(WORKERS)
        for s in (0, 1, 2, 3)
    )
)
HINTS = {
    "TypeError": "may_proceed(worker_clock, clocks, staleness): an int, a list of ints (every "
    "worker's finished clocks, its own among them) and an int",
}
RULE = "c - min(clocks) <= s"
# Whole-table mistakes: (rule, message), the first that matches every case names it.
RULES = [
    (
        lambda c, clocks, s: c - min(clocks) < s,
        "off by one: you let a worker go on only while c - slowest < s. SSP allows a lead of s "
        "clocks (c - slowest <= s); with s = 0 your rule blocks everyone, even the slowest "
        "worker, and BSP never starts.",
    ),
    (
        lambda c, clocks, s: c - min(clocks) <= s + 1,
        "one clock too many: c - slowest <= s + 1 lets a worker run s + 1 clocks ahead (with "
        f"s = 0 that is not BSP). SSP: {RULE}.",
    ),
    (
        lambda c, clocks, s: True,
        "may_proceed always says yes: that is the asynchronous parameter server (Downpour), "
        "staleness unbounded. Comparing with the fastest worker, c - max(clocks) <= s, or the "
        "difference the wrong way round, min(clocks) - c <= s, does exactly this. The bound is "
        f"on the lead over the slowest: {RULE}.",
    ),
    (
        lambda c, clocks, s: c - max(clocks) < s,
        "you compared with the fastest worker (max of the clocks). The bound is on the lead "
        f"over the slowest: {RULE}; the slowest worker must always be allowed on.",
    ),
    (
        lambda c, clocks, s: max(clocks) - c <= s,
        "you bounded how far this worker is behind the fastest (max(clocks) - c <= s); SSP "
        f"bounds how far it is ahead of the slowest: {RULE}.",
    ),
    (
        lambda c, clocks, s: c - min(clocks) <= 0,
        "you ignored the staleness s: a worker waits until it is level with the slowest, which "
        f"is BSP whatever s is. SSP lets it run s clocks ahead: {RULE}.",
    ),
    (
        lambda c, clocks, s: max(clocks) - min(clocks) <= s,
        "you bounded the spread between the fastest and the slowest worker, whoever asks: then "
        "the slowest worker (or one level with it) is blocked too, and nobody catches up. The "
        f"rule is about this worker's lead: {RULE}.",
    ),
    (
        lambda c, clocks, s: c - sum(clocks) / len(clocks) <= s,
        "you compared with the average clock; SSP bounds the lead over the slowest worker, "
        f"min(clocks): {RULE} (an average lets the fastest run away from a straggler).",
    ),
    (
        lambda c, clocks, s: c <= s,
        f"you compared the worker's clock with s alone; s bounds its lead over the slowest: "
        f"{RULE}.",
    ),
    (
        lambda c, clocks, s: c - min(clocks) > s,
        "your answer is inverted: True means the worker may go on, which it may while its lead "
        f"over the slowest is at most s: {RULE}.",
    ),
    (
        lambda c, clocks, s: c - min(clocks) >= s,
        "your answer is inverted: True means the worker may go on, which it may while its lead "
        f"over the slowest is at most s: {RULE}.",
    ),
]


def ssp_rule(worker_clock: int, clocks, staleness: int) -> bool:
    """The reference: the server's `pull_bound`, with the slowest clock as its version."""
    return min(clocks) >= pull_bound(worker_clock, staleness)


def _diagnose_rule(may_proceed: Callable) -> str | None:
    got = {}
    for c, clocks, s in CLOCK_CASES:
        call = f"may_proceed({c}, {list(clocks)}, {s})"
        value = learner_call(may_proceed, c, list(clocks), s, call=call, hints=HINTS)
        if type(value).__name__ not in ("bool", "bool_"):  # Python's or numpy's bool
            return (
                f"{call} returned {value!r}; return a bool (True: the worker may compute its "
                "next clock)."
            )
        got[(c, clocks, s)] = bool(value)
    right = {k: ssp_rule(*k) for k in got}
    if got == right:
        return None
    wrong = [k for k in got if got[k] != right[k]]
    c, clocks, s = wrong[0]
    example = (
        f"E.g. a worker at clock {c}, clocks {list(clocks)}, s = {s}: you said "
        f"{got[wrong[0]]}, SSP says {right[wrong[0]]} ({len(wrong)} of {len(got)} cases differ)."
    )
    for rule, message in RULES:
        if all(got[k] == rule(*k) for k in got):
            return f"{message} {example}"
    too_strict = all(not got[k] for k in wrong)
    by_s = sorted({k[2] for k in wrong})
    return (
        f"{example} Where you differ you always say "
        + (
            "no (too strict)"
            if too_strict
            else "yes (too lenient)"
            if all(got[k] for k in wrong)
            else "yes or no"
        )
        + f", for s in {by_s}. SSP: {RULE}."
    )


def simulate_ssp(
    may_proceed: Callable, staleness: int, durations=(1, 1, 3), clocks_to_run: int = 8
) -> list[int]:
    """Workers computing clocks of `durations[w]` ticks, each starting a clock only when
    `may_proceed(clock, clocks, s)`: the lead over the slowest of every clock started."""
    n = len(durations)
    clocks, busy_until = [0] * n, [None] * n
    leads: list[int] = []
    t = 0
    while min(clocks) < clocks_to_run:
        for w in range(n):
            if busy_until[w] == t:
                clocks[w], busy_until[w] = clocks[w] + 1, None
        for w in range(n):
            if busy_until[w] is None and clocks[w] < clocks_to_run:
                if may_proceed(clocks[w], list(clocks), staleness):
                    leads.append(clocks[w] - min(clocks))
                    busy_until[w] = t + durations[w]
        if all(b is None for b in busy_until) and min(clocks) < clocks_to_run:
            fail(f"s = {staleness}: at clocks {clocks} no worker may go on: a deadlock.")
        t += 1
    return leads


def check_may_proceed(may_proceed: Callable) -> None:
    """`may_proceed(worker_clock, clocks, staleness)` on a table of cases, then simulated."""
    problem = _diagnose_rule(may_proceed)
    if problem:
        fail(problem)
    observed = {}
    for s in (0, 1, 2):
        leads = simulate_ssp(may_proceed, s)
        if max(leads) != s:  # unreachable when the table matched
            fail(f"s = {s}: the largest lead in the simulation was {max(leads)}, not {s}")
        observed[s] = max(leads)
    passed(
        f"may_proceed agrees with SSP on {len(CLOCK_CASES)} cases; simulated with one worker "
        f"3x slower, the largest lead over the slowest for s = 0, 1, 2: "
        f"{list(observed.values())} (never above s, and the fast workers use all of it)"
    )
