"""Checkers for lesson 15's exercises (Liu et al. 2023, "Ring Attention", section 3).

1. `check_merge(merge)`: `merge(o, lse, o_blk, lse_blk)` returns (o', lse'), the attention
   over the union of two disjoint key sets from the two partial attentions and their
   log-sum-exps: lse' = log(e^lse + e^lse_blk), o' = o·e^(lse-lse') + o_blk·e^(lse_blk-lse').
   Checked on many random cases (float32 and float64, rows where one side or both have
   seen no key yet, lse = -inf, e^100 that overflows float32), then folded over a ring's
   key blocks in every rank's order against torch's attention on the whole sequence.
2. `check_block_attention(block_attention)`: `block_attention(q, k, v, q_pos, k_pos,
   scale)` returns (o, lse) of q's rows over one key block with the causal mask taken from
   the GLOBAL positions q_pos, k_pos (a key is seen when k_pos <= q_pos); rows that see no
   key get o = 0 and lse = -inf. Checked on the zig-zag blocks of c = 2 and 3 (float64 and
   float32), blocks of unequal lengths at scattered positions, all-zero queries and scores
   beyond exp's range (900 in float64, 120 in float32).

The form of an answer (a pair, tensors not numpy, (o, lse) not (lse, o), shapes, dtype) is
checked before any value (`_shared.form_problem`), and a diagnosis that raises falls back to a
message (`course.guard.guarded`). Every catalogued mistake (the tests' `MERGE_MISTAKES`,
`BLOCK_MISTAKES`, ...) is predicted and named; anything else gets where it differs.
"""

from .block import check_block_attention
from .merge import check_merge

__all__ = ["check_merge", "check_block_attention"]
