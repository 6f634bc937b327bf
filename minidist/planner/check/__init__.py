"""Checkers for the exercises of lesson 13 (planning a layout): predict, then compare with
the planner and with a run.

1. `check_bytes_per_step(bytes_per_step)`: `bytes_per_step(numels, world, zero)` returns the
   bytes one rank sends per training step (float32, ring model, `comm.ring_bytes`) under
   data parallelism with ZeRO stage `zero` (0: DDP, 1-2: ZeRO, 3: FSDP); `numels` are the
   trainable elements of each gradient bucket (stages 0-2) or each FSDP unit, the root unit
   last (stage 3). Compared with `plan(...).bytes_sent` for the course GPT on worlds of 2, 3
   and 4, then with the ledger of a real ZeRO-2 run on 3 ranks. A wrong answer is matched
   against readings of the rule (padding: none, of the total, one chunk too many, DDP
   padded; elements, 16-bit, float64 or bits instead of float32 bytes; the whole message or
   an all-reduce as one pass instead of the ring's share; gradients all-reduced or never
   reduced; ZeRO's all-gather forgotten or FSDP's gathers misapplied, the root re-gathered
   or taken first), and the reading consistent with most of the learner's answers named.
2. `check_pipeline_prediction(pipeline_prediction)`: `pipeline_prediction(pp, microbatches,
   schedule, microbatch_bytes)` returns (bubble, activation bytes) of the first stage for
   "gpipe" and "1f1b". Compared with `plan(...).bubble` and `plan(...).memory["activations"]`
   for the course GPT of lesson 09, then with the peak saved bytes of real pipelines on 2
   ranks. Named mistakes: the bubble over the ideal time (Narayanan's (p-1)/m) instead of
   the step's share, p for p-1, m+p for m+p-1, a percentage, the busy share, 1F1B without or
   with half a bubble; GPipe's m micro-batches for 1F1B or 1F1B's min(p, m) for GPipe, min
   forgotten, one short, every stage's bytes, the bytes scaled by 4; the tuple swapped.

A learner's exception becomes a message (`_shared.call_learner`): what was raised, at which
line of their code, and the exercise's likely cause.
"""

from .bytes_per_step import BYTES_CASES, RUN_WORLD, check_bytes_per_step
from .pipeline_prediction import PIPELINE_CASES, RUN_CASES, check_pipeline_prediction

__all__ = [
    "BYTES_CASES",
    "RUN_WORLD",
    "check_bytes_per_step",
    "PIPELINE_CASES",
    "RUN_CASES",
    "check_pipeline_prediction",
]
