"""Checkers for the exercises of lesson 12 (parameter servers and the shape of the network).

1. `check_may_proceed(may_proceed)`: `may_proceed(worker_clock, clocks, staleness) -> bool`,
   SSP's admission rule (Ho et al. 2013): a worker about to compute clock c (having finished
   c clocks) may go on when c - min(clocks) <= s, `clocks` being every worker's finished
   clocks; s = 0 is BSP. The same rule as the library's server, which answers a pull at clock
   c once its version (the slowest worker's clock) is at least `pull_bound(c, s)`. Compared on
   a table of cases, then run in a small simulation with a slow worker: the lead of any
   worker over the slowest never exceeds s, and the fast ones use all of it. Named mistakes:
   off by one (< instead of <=), the fastest worker instead of the slowest, the staleness
   ignored (BSP whatever s, or always True: asynchronous).
2. `check_link_class_bytes(link_class_bytes)`: `link_class_bytes(numel, inner_size,
   outer_size, element_size) -> {"inner": bytes, "outer": bytes}`, what one rank sends on
   each link class in a two-level (2D-mesh or hierarchical) all-reduce, numel a multiple of
   I·O. Compared with `minidist.network.theory.two_level_bytes` over a grid of meshes, then
   with the ledger of a real `torus_all_reduce` on a 2×2 mesh of 4 ranks. Named mistakes:
   the outer links' 1/I missing (they all-reduce one chunk, not the tensor), the all-gather
   counted twice, the inner and outer group sizes swapped.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
import torch.distributed as dist

from .. import comm
from ..course.check import fail, passed, run_on_world
from ..network import Mesh2D, bytes_by_link_class, torus_all_reduce
from ..network import theory as net_theory
from .server import pull_bound

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


# -- exercise 2: a two-level all-reduce's bytes per link class --------------------------------

MESHES = [(i, o) for i in (1, 2, 4, 8) for o in (1, 2, 4, 16)]
MESH_NUMEL = 4096  # a multiple of every I·O above
REAL_NUMEL = 1024  # the 2×2 mesh's tensor: a multiple of 4


def _diagnose_bytes(fn: Callable) -> str | None:
    for i, o in MESHES:
        got = fn(MESH_NUMEL, i, o, 4)
        if not isinstance(got, dict) or set(got) != {"inner", "outer"}:
            return (
                f"link_class_bytes({MESH_NUMEL}, {i}, {o}, 4) returned {got!r}; return "
                '{"inner": bytes, "outer": bytes}.'
            )
    wrong = []
    for i, o in MESHES:
        got = fn(MESH_NUMEL, i, o, 4)
        right = net_theory.two_level_bytes(MESH_NUMEL, i, o, 4)
        if any(abs(got[k] - right[k]) > 1e-9 * max(1.0, right[k]) for k in right):
            wrong.append((i, o, got, right))
    if not wrong:
        return None
    size = MESH_NUMEL * 4

    def like(key: str, formula: Callable) -> bool:
        return all(abs(got[key] - formula(i, o)) < 1e-6 for i, o, got, _ in wrong)

    ring = lambda k, n: k * (n - 1) / n * size
    if like("outer", lambda i, o: ring(2, o)) and like("inner", lambda i, o: ring(2, i)):
        return (
            "the outer links: you counted an all-reduce of the whole tensor, 2(O-1)/O·S. After "
            "the inner reduce-scatter each rank holds one chunk of 1/I of the tensor, and only "
            "that chunk is all-reduced across the outer group: 2(O-1)/O·S/I."
        )
    if like("inner", lambda i, o: ring(3, i)):
        return (
            "the inner links: you counted the all-gather twice, 3(I-1)/I·S. The inner group "
            "runs one reduce-scatter, (I-1)/I·S, and one all-gather, (I-1)/I·S: 2(I-1)/I·S."
        )
    if like("inner", lambda i, o: ring(2, o)) or like("outer", lambda i, o: ring(2, i) / o):
        return (
            "the inner and outer group sizes are swapped: I ranks share the inner links "
            "(reduce-scatter and all-gather, 2(I-1)/I·S), O the outer ones (2(O-1)/O·S/I)."
        )
    i, o, got, right = wrong[0]
    return (
        f"e.g. I = {i}, O = {o}, {MESH_NUMEL} float32: you said {got}, the ring model gives "
        f"{right} ({len(wrong)} of {len(MESHES)} meshes differ)."
    )


def _torus_ledger_on_rank() -> dict[str, dict[str, float]]:
    mesh = Mesh2D(2, 2)
    out = {}
    for inner in ("row", "column"):
        x = torch.ones(REAL_NUMEL) * (dist.get_rank() + 1)
        with comm.record() as ledger:
            torus_all_reduce(x, mesh, inner=inner)
        assert torch.equal(x, torch.full_like(x, 10.0))  # 1 + 2 + 3 + 4
        out[inner] = bytes_by_link_class(ledger, mesh)
    return out


def check_link_class_bytes(link_class_bytes: Callable) -> None:
    """`link_class_bytes(numel, inner_size, outer_size, element_size)` against the formula
    on a grid of meshes, then against the ledger of a real 2×2 torus all-reduce."""
    problem = _diagnose_bytes(link_class_bytes)
    if problem:
        fail(problem)
    ledgers = run_on_world(_torus_ledger_on_rank, 4)
    yours = link_class_bytes(REAL_NUMEL, 2, 2, 4)
    for rank, by_inner in enumerate(ledgers):
        for inner, sent in by_inner.items():
            outer = "column" if inner == "row" else "row"
            if sent[inner] != yours["inner"] or sent[outer] != yours["outer"]:  # unreachable
                fail(f"rank {rank}, {inner}-inner: the ledger says {sent}, you said {yours}")
    b = link_class_bytes(MESH_NUMEL, 8, 4, 4)
    passed(
        f"link_class_bytes matches the ring model on {len(MESHES)} meshes and the ledger of a "
        f"real 2x2 torus all-reduce of {REAL_NUMEL} float32 (inner {yours['inner']:g} B, "
        f"outer {yours['outer']:g} B per rank); e.g. I = 8, O = 4, {MESH_NUMEL} float32: "
        f"inner {b['inner']:g} B, outer {b['outer']:g} B"
    )
