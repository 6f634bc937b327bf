"""Checkers for the exercises of lesson 12 (parameter servers and the shape of the network).

1. `check_may_proceed(may_proceed)`: `may_proceed(worker_clock, clocks, staleness) -> bool`,
   SSP's admission rule (Ho et al. 2013): a worker about to compute clock c (having finished
   c clocks) may go on when c - min(clocks) <= s, `clocks` being every worker's finished
   clocks; s = 0 is BSP. The same rule as the library's server, which answers a pull at clock
   c once its version (the slowest worker's clock) is at least `pull_bound(c, s)`. Compared on
   a table of cases, then run in a small simulation with a slow worker: the lead of any
   worker over the slowest never exceeds s, and the fast ones use all of it. Named mistakes
   (`RULES`): off by one either way (< s, <= s + 1), the fastest worker instead of the
   slowest (or the difference the wrong way round), the staleness ignored (BSP whatever s,
   or always True: asynchronous), the average clock, the clock against s alone, the answer
   inverted; a non-bool. CLOCK_CASES are distinct, so pass and fail count the same cases.
2. `check_link_class_bytes(link_class_bytes)`: `link_class_bytes(numel, inner_size,
   outer_size, element_size) -> {"inner": bytes, "outer": bytes}`, what one rank sends on
   each link class in a two-level (2D-mesh or hierarchical) all-reduce, numel a multiple of
   I·O. Compared with `minidist.network.theory.two_level_bytes` over a grid of meshes, then
   with the ledger of a real `torus_all_reduce` on a 2×2 mesh of 4 ranks; element sizes 4
   and 2. Each link class is named on its own (`INNER`, `OUTER`: the formula that matches
   every mesh): the outer links' 1/I missing, the chunk taken as 1/O, half the outer
   all-reduce, the all-gather counted twice, the inner links off by 2x, the group sizes
   swapped, payloads for ring bytes, elements for bytes, 4-byte elements assumed, bits,
   the two classes added; otherwise how many meshes differ and an example. M: the
   message's bytes.
"""

from .link_class_bytes import MESH_NUMEL, MESHES, REAL_NUMEL, check_link_class_bytes
from .may_proceed import CLOCK_CASES, WORKERS, check_may_proceed, simulate_ssp, ssp_rule

__all__ = [
    "WORKERS",
    "CLOCK_CASES",
    "ssp_rule",
    "simulate_ssp",
    "check_may_proceed",
    "MESHES",
    "MESH_NUMEL",
    "REAL_NUMEL",
    "check_link_class_bytes",
]
