"""What lesson 13's notebook plans at cluster scale (the course's own layouts, as the tour
runs them, are `course.course_plan`).

- `GPT3_175B`, `A100_BATCH`: the model and batch of the notebook's sweep (Brown et al. 2020,
  Table 2.1: 96 layers, hidden 12,288, 96 heads, sequence 2,048; the vocabulary of
  Narayanan et al. 2021's runs, 51,200).
- `sweep_micro_batch`: `plan.sweep`, with micro-batches of `micro_batch` sequences whatever
  dp is (the pipeline then runs B / (dp · micro_batch) of them), as Megatron-LM's runs do.
"""

from __future__ import annotations

import dataclasses

from .hardware import Cluster
from .plan import Plan, layouts, plan
from .spec import Layout, ModelSpec

GPT3_175B = ModelSpec(layers=96, hidden=12288, heads=96, vocab=51200, seq=2048)
A100_BATCH = 1536  # sequences per step (GPT-3's 3.2M tokens per batch, rounded to 2^9 · 3)


def sweep_micro_batch(
    model: ModelSpec, world: int, cluster: Cluster, micro_batch: int = 1, **fixed
) -> list[Plan]:
    """`plan` of every layout of `world` with micro-batches of `micro_batch` sequences: every
    layout runs global_batch / (dp · micro_batch) of them, through its pipeline or, without
    one, one after another with the gradients accumulated (the `--micro-batch` help text, and
    what the chosen layout of `python -m minidist plan` runs). An MoE GPT routes a replica's
    batch at once (lesson 16: one capacity per step), so without a pipeline it runs one.
    Layouts whose dp does not divide the batch into such micro-batches are left out."""
    batch = fixed.get("global_batch", Layout.global_batch)
    out = []
    for layout in layouts(model, world, **fixed):
        per_replica = batch // layout.dp
        if batch % layout.dp or per_replica % micro_batch:
            continue
        m = per_replica // micro_batch if layout.pp > 1 or not model.experts else 1
        out.append(plan(model, dataclasses.replace(layout, microbatches=m), cluster))
    return out
