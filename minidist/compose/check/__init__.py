"""Checkers for the exercises of lesson 17 (every parallelism at once).

1. `check_build_groups(build_groups)`: `build_groups(pp, dp_replicate, dp_shard, cp, tp,
   ep)` returns {kind: rank lists} for tp, cp, dp_shard, dp_replicate, pp, dp_shard_cp,
   dp_cp and ep, compared with `compose.dims.grid_groups` on sampled layouts of 1 to 32
   ranks, sizes of 1, 3 and 5 included. Named mistakes: bit-shift packing, ranks from 1, tp
   not innermost, pp not outermost, dp_shard and dp_replicate swapped, cp outside dp_shard,
   ZeRO's shard group without cp or dp_shard or with dp_replicate, dp_cp without
   dp_replicate or cp or with tp, ep across dp_replicate, strided, cut with cp outermost or
   from dp_shard alone, or of the wrong size, groups of one rank dropped, ranks missing or
   twice.
2. `check_reduced_over(reduced_over)`: `reduced_over(model_name, name, dims)` returns the
   group kinds a parameter's gradient is summed over, compared (as sets of ranks) with
   `parallelize.py`'s table for every parameter of the GPT, its MoE form and the Llama model
   on sampled layouts. Named mistakes: cp, dp_shard or dp_replicate forgotten, the plan
   matched against the parameter's name, sp norms not summed over tp, split or (without sp)
   replicated weights summed over tp, replicated K/V not summed over tp, the tied embedding
   without its first and last stage, the Llama embedding taken as tied, pp added, experts
   over all of dp, the ep group or ep_shard alone, the router taken for an expert.

Both ask every case first and name a mistake only when it gives the learner's answer on
every case the learner got wrong; otherwise the message shows the first wrong case.

A learner's exception becomes a message (`course.failures.call_learner`: what was raised,
where in their code, the likely cause).
"""

from .gradients import GRAD_CASES, check_reduced_over, right_kinds
from .groups import KINDS, check_build_groups

__all__ = ["GRAD_CASES", "KINDS", "check_build_groups", "check_reduced_over", "right_kinds"]
