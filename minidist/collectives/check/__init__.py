"""Checkers for lesson 00: a ring all-reduce and a ring all-gather built from send/recv.

Each checker runs the learner's function on worlds of 2, 3 and 4 ranks (odd sizes, lengths
that do not divide by N) and compares with the collective it imitates. Inputs are chosen so
that every value says where it came from, and the ledger keeps a copy of every chunk each
rank sent, so a wrong answer is explained by phase, step and chunk:

- all-reduce input on rank r, element i: 2^r + 2^N·i. A sum over a set of ranks S keeps S in
  its low N bits and the element index above them, so any sent or returned value decodes
  into "sum of ranks S of element i". The ring's schedule says what rank r must send at
  every step (Patarasuk & Yuan 2009, section 3): at reduce-scatter step s chunk (r-s) mod N
  holding the sum of ranks r, r-1, ..., r-s; at all-gather step s chunk (r+1-s) mod N
  holding the sum of all ranks. The first send that differs names the mistake.
- all-gather input on rank r, element i: 100·r + i, so each block names its source; what a
  rank received at step s is what its left neighbour sent at step s.

Then the ledger must show only send/recv, and each rank must send what the ring sends
(`theory.ring_all_reduce_bytes`, `theory.ring_all_gather_bytes`).
"""

from ._shared import AG, ALL_GATHER_CASES, ALL_REDUCE_CASES, RING_HANG_HINT, RS, RULES
from .all_gather import check_ring_all_gather
from .all_reduce import check_ring_all_reduce

__all__ = [
    "ALL_REDUCE_CASES",
    "ALL_GATHER_CASES",
    "RING_HANG_HINT",
    "RS",
    "AG",
    "RULES",
    "check_ring_all_gather",
    "check_ring_all_reduce",
]
