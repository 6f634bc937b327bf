"""Checkers for the data-parallel exercises of lesson 01.

1. `check_average_gradients(average_gradients)`: naive DP. After `backward()` every rank
   calls the learner's `average_gradients(model)`, which must leave in every `p.grad` the
   mean over ranks (all-reduce SUM, then divide by N). Compared on worlds of 2 and 4 with one
   process training on the concatenated batch, on worlds of 3, 2 and 4.
2. `check_grad_bucket(GradBucket)`: one DDP bucket (Li et al. 2020, "PyTorch Distributed",
   sections 3.2-3.3). `GradBucket(params, world_size)` lays the gradients of `params` out
   in a flat buffer in the given order; `on_grad_ready(param)` (a post-accumulate-grad hook)
   copies the gradient into its slot and, when the last one arrives, pre-divides the buffer
   by N and launches ONE `comm.all_reduce(buffer, async_op=True)`; `wait()` finishes it,
   writes the mean back into every `param.grad` and readies the bucket for the next step.

Both compare gradients with the reference and read a `comm.record()` ledger, so a wrong
answer is named: forgot to divide, divided twice, skipped parameters, launched per
parameter, launched early, wrong offsets.
"""

from ._shared import GLOBAL_BATCH, STEPS, WORLDS
from .average import check_average_gradients
from .bucket import check_grad_bucket

__all__ = ["GLOBAL_BATCH", "STEPS", "WORLDS", "check_average_gradients", "check_grad_bucket"]
