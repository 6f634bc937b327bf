"""Step 3 of `parallelize` for any decoder model: context parallelism by swapping only the
attention kernel.

Each rank holds zig-zag chunks of the sequence (Liu et al. 2023 §3; the stage passes their
global `position_ids`, so the model's own rotary embedding rotates each token at its place,
and the course GPT looks its learned positions up there). The attention module keeps its
forward, its projections, its scaling and its rotary; only the kernel it dispatches to
(`config._attn_implementation`, Hugging Face's attention interface; a course attention's
`attn_implementation`, the same interface) becomes lesson 15's `ring_attention` over the cp
group: causal by global position, with the module's sliding window (Mistral) and scale.
GQA's K/V are repeated to the query heads first, as the model's own SDPA path does. Not
composed: attention dropout in training, soft-capping, a padding mask (refused where they
appear).
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

from ..context_parallel.ring import ring_attention
from ..models import ATTENTION_FUNCTIONS
from .split import Stage

NAME = "minidist_ring"


def _ring_kernel(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout=0.0,
    scaling=None,
    sliding_window=None,
    **kwargs,
):
    group, seq = module._minidist_cp
    if dropout:
        raise ValueError(f"parallelize: attention dropout {dropout} with cp > 1 is not composed")
    if kwargs.get("softcap") is not None:
        raise ValueError("parallelize: attention soft-capping with cp > 1 is not composed")
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # one K/V head per query head (the model's SDPA path does the same)
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    dv = value.shape[-1]
    if dv != query.shape[-1]:  # latent attention's V is narrower than Q·K: zero columns
        value = torch.nn.functional.pad(value, (0, query.shape[-1] - dv))
    out = ring_attention(
        query, key, value, group, "zigzag", seq, scale=scaling, window=sliding_window
    )
    return out[..., :dv].transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, _ring_kernel)


def apply_context_parallel(stage: Stage, group, seq: int) -> int:
    """Every attention module of `stage` dispatches to ring attention over `group`; the
    number of modules swapped. A transformers attention names its kernel in its config
    (`_attn_implementation`), a course attention in `attn_implementation`
    (`minidist.models.ATTENTION_FUNCTIONS`)."""
    if stage.hf:
        _register()
    ATTENTION_FUNCTIONS[NAME] = _ring_kernel
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
        module._minidist_cp = (group, seq)
        swapped += 1
    if not swapped:
        raise ValueError(
            f"parallelize: cp found no attention module in {type(stage.model).__name__}"
        )
    return swapped
