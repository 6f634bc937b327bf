"""Checkers for lesson 16's exercises (Fedus et al. 2022, Switch Transformer, section 2.2).

1. `check_dispatch(dispatch)`: `dispatch(expert, num_experts, capacity_factor)` takes each
   token's expert id (top-1) and returns, for each expert, (kept, dropped): the indices of
   its tokens it keeps and those it drops, both in token order; an expert keeps its first
   C = ⌈capacity_factor · T / E⌉ tokens. Checked on many sampled routings: E from 1 to 16,
   1 to 100 tokens, capacity factors 0.5 to 2, skewed and uniform routings, experts with no
   token, C·E exact and not.
2. `check_load_balancing_loss(loss)`: `loss(probs, expert)` returns E · Σ_e f_e · P_e, f_e
   the fraction of tokens whose expert is e, P_e the mean of the router probability of e
   over all tokens (a differentiable tensor of probs' dtype): its value and its gradient with
   respect to probs, in float32 and float64, with choices that are probs' argmax and choices
   that are not, and on the two ends (uniform: 1, all on one expert: E).
3. `check_priority(priority)`: `priority(experts, num_experts, capacity_factor)` takes each
   token's k choices [T, k] and returns (slot, kept) [T, k]: each assignment's position in its
   expert's buffer, every first choice before any second and tokens in order within a choice
   (GShard, Algorithm 1), and whether it is within C = ⌈capacity_factor · T · k / E⌉ (slot
   int64, kept bool). Checked on sampled routings with k = 1 to 3 against `routing.route`; a
   wrong C is found from the learner's own kept.

All call the learner's function with a time limit, on copies of the inputs that must come
back unchanged. Every catalogued mistake (`tests/test_check_expert_parallel.py`) is named;
for anything else the checker says on which routing it differs and how.
"""

from .aux_loss import check_load_balancing_loss
from .dispatch import check_dispatch
from .priority import check_priority

__all__ = ["check_dispatch", "check_load_balancing_loss", "check_priority"]
