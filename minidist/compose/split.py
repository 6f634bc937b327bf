"""Step 1 of `parallelize` for any decoder model: the pipeline split into lesson 09's
`Stage`s (`pipeline.stages`: a copy of the model with the layers it does not hold removed
and the parts that belong elsewhere absent; the model's own forward runs)."""

from __future__ import annotations

import copy

import torch.nn as nn

from ..model_parts import find_parts
from ..pipeline.stages import Stage, StageContext
from ..three_d.theory import stage_layers


def split_model(model: nn.Module, stages: int, index: int, ctx: StageContext) -> Stage:
    """Virtual stage `index` of `stages` over a copy of `model` (lesson 10's `stage_layers`:
    the layers dealt out as evenly as possible)."""
    parts = find_parts(model)
    n = len(getattr(parts.base, parts.layers_name))
    if n < stages:
        raise ValueError(f"parallelize: {n} layers do not fill {stages} pipeline stages")
    held = stage_layers(n, stages)[index]
    return Stage(copy.deepcopy(model), held, index == 0, index == stages - 1, ctx)
