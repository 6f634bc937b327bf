"""Checkers for the exercises of lesson 13 (planning a layout): predict, then compare with
the planner and with a run.

1. `check_bytes_per_step(bytes_per_step)`: `bytes_per_step(numels, world, zero)` returns the
   bytes one rank sends per training step (float32, ring model, `comm.ring_bytes`) under
   data parallelism with ZeRO stage `zero` (0: DDP, 1-2: ZeRO, 3: FSDP); `numels` are the
   trainable elements of each gradient bucket (stages 0-2) or each FSDP unit, the root unit
   last (stage 3). Compared with `plan(...).bytes_sent` for the course GPT on worlds of 2, 3
   and 4, then with the ledger of a real ZeRO-2 run on 3 ranks. Named mistakes: no padding,
   ZeRO's all-gather forgotten, FSDP's backward gathers forgotten or the root re-gathered,
   the whole message instead of the ring's (N-1)/N, elements instead of bytes.
2. `check_pipeline_prediction(pipeline_prediction)`: `pipeline_prediction(pp, microbatches,
   schedule, microbatch_bytes)` returns (bubble, activation bytes) of the first stage for
   "gpipe" and "1f1b". Compared with `plan(...).bubble` and `plan(...).memory["activations"]`
   for the course GPT of lesson 09, then with the peak saved bytes of real pipelines on 2
   ranks. Named mistakes: the bubble over the ideal time instead of the step's share, p for
   p-1, GPipe's m micro-batches for 1F1B or 1F1B's p for GPipe, min(p, m) forgotten.
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
