"""Checkers for the exercises of lessons 07 (tensor parallelism) and 08 (the parallel layout).

Lesson 07 (Shoeybi et al. 2019, "Megatron-LM", section 3):

1. `check_reduce_from_tp(ReduceFromTP)`: g as a `torch.autograd.Function`:
   `forward(ctx, x, group)` all-reduces (sums) the partial outputs over the tp group,
   `backward(ctx, grad)` is the identity. Run on worlds of 2 and 3 (the group is the world)
   and of 4 (two tp groups of 2); rank r's input at element i is (i + 1) + 100·2^q (q its tp
   rank), and its upstream gradient differs per tp rank (in a model it is the same
   everywhere; here any communication in backward shows in the values); every
   torch.distributed call is counted beside the ledger. Named mistakes: all-reduce in
   backward instead of forward (that is f), identity both ways, all-reduced the input in
   place (no clone), all-reduce in both directions, a mean in backward (through comm or
   torch.distributed), backward divided by t, any torch.distributed collective in backward
   or forward, an async all-reduce never waited for, summed over the world instead of the
   group, averaged, no gradient, the wrong number of gradients.
2. `check_vocab_parallel_cross_entropy(fn)`: `fn(logits, targets, group, start,
   vocab_size)` gets this rank's columns [start, start + V'/t) of the logits (vocabulary
   padded to V'; columns >= vocab_size are padding) and returns the mean cross entropy, the
   value of `F.cross_entropy` on the full logits, with three all-reduces of one number per
   token. Four cases: ordinary logits on 2 ranks, padded vocabulary on 4, large logits
   (around 1000) on 2, and on 3 ranks targets on ranks 0 and 1 only (rank 2 holds none);
   targets sit at the first, last and middle column of a range. Named mistakes: no MAX
   all-reduce (overflow, or each rank's own max), target logit not masked outside the
   rank's range, the range off by one at either end (the upper one raises an index error,
   caught and named: a negative index, one past the end, or beyond it, each its cause),
   the target logit not shifted by M, forgot the SUM of exp, forgot to all-reduce the
   target logit, or made it only where the rank holds a target, padding not masked or
   masked from vocab_size + 1, a sum instead of a mean, the full logits gathered.
   A wrong loss that no predicted value explains (the mistake written another way, e.g.
   M + log Σ exp(logit - M) - logit_target) is probed on crafted one-token rows
   (`ce_probe.py`): which columns counted as the target names a clamped instead of masked
   index (or one end of the range unmasked), a missing start offset, a range that includes
   its end, the owner's wrong column, a target logit never all-reduced; right where every
   rank's maximum is the same and wrong elsewhere names a row maximum never all-reduced.

Lesson 08 (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", section 3):

3. `check_parallel_groups(my_parallel_groups)`: `my_parallel_groups(world_size, tp, pp)`
   returns {"tp", "pp", "dp"}: lists of ranks, compared with `parallel_groups` as a pure
   function (no world). Named mistakes: DP groups taken as contiguous blocks or spanning
   pipeline stages, PP groups contiguous, TP groups strided across nodes, tp and pp
   swapped, groups one rank short or long (a range off by one), ranks missing or repeated,
   groups of the wrong size, not a list of lists.
4. `check_average_dp_gradients(average_dp_gradients)`: on worlds of 4 (t = d = 2) and 6
   (t = 2, d = 3), after a backward of `TensorParallelGPT` on this rank's data-parallel
   slice, `average_dp_gradients(model, dp_group)` must leave in every gradient the mean over
   the dp group, the dense GPT's gradient of the whole batch. Named mistakes: reduced over
   the world or over the tp group; from the uniform factor on both layouts: forgot to
   divide, divided by t, by d - 1, by the world size, or by d twice; skipped parameters
   (split or replicated), reduced a copy, async all-reduces never waited for,
   torch.distributed called directly, bytes sent
   beyond one all-reduce of the gradients. `average_dp_verdicts(fns)` runs many answers in
   one world launch per layout.
"""

from .cross_entropy import (
    CE_ATOL,
    CE_CASES,
    CE_HANG_HINT,
    CE_MESSAGES,
    CE_OVERFLOW,
    CE_OWNERS,
    CE_RTOL,
    CE_TOKENS,
    check_vocab_parallel_cross_entropy,
)
from .dp_gradients import (
    DP_HANG_HINT,
    DP_LAYOUTS,
    DP_TP,
    DP_WORLD,
    average_dp_verdicts,
    check_average_dp_gradients,
)
from .g_operator import G_CASES, G_HANG_HINT, G_NUMEL, G_WORLDS, check_reduce_from_tp
from .layout import GROUP_CASES, GROUP_KINDS, GROUP_RULES, check_parallel_groups

__all__ = [
    "DP_WORLD",
    "DP_TP",
    "DP_HANG_HINT",
    "DP_LAYOUTS",
    "average_dp_verdicts",
    "check_average_dp_gradients",
    "G_WORLDS",
    "G_CASES",
    "G_NUMEL",
    "G_HANG_HINT",
    "check_reduce_from_tp",
    "GROUP_CASES",
    "GROUP_KINDS",
    "GROUP_RULES",
    "check_parallel_groups",
    "CE_TOKENS",
    "CE_CASES",
    "CE_OWNERS",
    "CE_RTOL",
    "CE_ATOL",
    "CE_HANG_HINT",
    "CE_OVERFLOW",
    "CE_MESSAGES",
    "check_vocab_parallel_cross_entropy",
]
