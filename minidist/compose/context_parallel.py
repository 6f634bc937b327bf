"""Step 3 of `parallelize` for any decoder model: context parallelism by swapping only the
attention kernel.

Each rank holds zig-zag chunks of the sequence (Liu et al. 2023 §3; the stage passes their
global `position_ids`, so the model's own rotary embedding rotates each token at its place,
and the course GPT looks its learned positions up there). The attention module keeps its
forward, its projections, its scaling and its rotary; only the kernel it dispatches to
(`config._attn_implementation`, Hugging Face's attention interface; a course attention's
`attn_implementation`, the same interface) becomes lesson 15's ring attention kernel
(`context_parallel.kernel`) over the cp group: causal by global position, with the module's
sliding window (Mistral) and scale. Not composed: attention dropout in training,
soft-capping, a padding mask (refused where they appear).
"""

from __future__ import annotations

import copy

import torch.nn as nn

from ..context_parallel.kernel import NAME, ring_attention_kernel
from ..models import ATTENTION_FUNCTIONS
from ..pipeline.stages import Stage


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, ring_attention_kernel)


def apply_context_parallel(stage: Stage, group, seq: int) -> int:
    """Every attention module of `stage` dispatches to ring attention over `group`; the
    number of modules swapped. A transformers attention names its kernel in its config
    (`_attn_implementation`), a course attention in `attn_implementation`
    (`minidist.models.ATTENTION_FUNCTIONS`)."""
    if stage.hf:
        _register()
    ATTENTION_FUNCTIONS[NAME] = ring_attention_kernel
    swapped = 0
    for module in stage.model.modules():
        config = getattr(module, "config", None)
        if (
            isinstance(module, nn.Module)
            and config is not None
            and hasattr(config, "_attn_implementation")
            and any(hasattr(module, n) for n in ("q_proj", "qkv_proj", "c_attn"))
        ):
            module.config = copy.copy(config)
            module.config._attn_implementation = NAME
        elif "attn_implementation" in vars(module):
            module.attn_implementation = NAME
        else:
            continue
        module.cp_ring = (group, "zigzag", seq)
        swapped += 1
    if not swapped:
        raise ValueError(
            f"parallelize: cp found no attention module in {type(stage.model).__name__}"
        )
    return swapped
