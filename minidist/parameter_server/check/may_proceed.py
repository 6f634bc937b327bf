"""Checker of exercise 1 of lesson 12: SSP's admission rule, `may_proceed(worker_clock,
clocks, staleness)` (Ho et al. 2013), against the server's `pull_bound`, then simulated."""

from __future__ import annotations

import itertools
from collections.abc import Callable

from ...course.check import fail, passed
from ..server import pull_bound

# -- exercise 1: SSP's admission rule ---------------------------------------------------------

WORKERS = 3
CLOCK_CASES = [
    (clocks[w], clocks, s)
    for clocks in itertools.product(range(5), repeat=WORKERS)
    for w in range(WORKERS)
    for s in (0, 1, 2, 3)
]


def ssp_rule(worker_clock: int, clocks, staleness: int) -> bool:
    """The reference: the server's `pull_bound`, with the slowest clock as its version."""
    return min(clocks) >= pull_bound(worker_clock, staleness)


def _diagnose_rule(may_proceed: Callable) -> str | None:
    got = {}
    for c, clocks, s in CLOCK_CASES:
        value = may_proceed(c, list(clocks), s)
        if not isinstance(value, bool):
            return (
                f"may_proceed({c}, {list(clocks)}, {s}) returned {value!r}; return a bool "
                "(True: the worker may compute its next clock)."
            )
        got[(c, clocks, s)] = value
    right = {k: ssp_rule(*k) for k in got}
    if got == right:
        return None
    like = lambda rule: all(got[k] == rule(*k) for k in got)
    if like(lambda c, clocks, s: c - min(clocks) < s):
        return (
            "off by one: you let a worker go on only while c - slowest < s. SSP allows a lead "
            "of s clocks (c - slowest <= s); with s = 0 your rule blocks everyone, even the "
            "slowest worker, and BSP never starts."
        )
    if like(lambda c, clocks, s: True):
        return (
            "may_proceed always says yes: that is the asynchronous parameter server (Downpour), "
            "staleness unbounded. Comparing with the fastest worker, c - max(clocks) <= s, "
            "does exactly this (no worker is ahead of the fastest). The bound is on the lead "
            "over the slowest: c - min(clocks) <= s."
        )
    if any(like(rule) for rule in (lambda c, clocks, s: c - max(clocks) < s,
                                   lambda c, clocks, s: max(clocks) - c <= s)):  # fmt: skip
        return (
            "you compared with the fastest worker (max of the clocks). The bound is on the "
            "lead over the slowest: c - min(clocks) <= s; the slowest worker must always be "
            "allowed on, or nobody ever catches up."
        )
    if like(lambda c, clocks, s: c - min(clocks) <= 0):
        return (
            "you ignored the staleness s: a worker waits until it is level with the slowest, "
            "which is BSP whatever s is. SSP lets it run s clocks ahead: c - min(clocks) <= s."
        )
    wrong = [k for k in got if got[k] != right[k]]
    c, clocks, s = wrong[0]
    return (
        f"e.g. a worker at clock {c}, clocks {list(clocks)}, s = {s}: you said {got[wrong[0]]}, "
        f"SSP says {right[wrong[0]]} ({len(wrong)} of {len(got)} cases differ)."
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
