"""Ring attention as an attention kernel: the one call of a model's attention that context
parallelism swaps (lesson 15, used again by lesson 17's `compose.context_parallel`).

The kernel has the form of transformers' attention interface (`AttentionInterface`; the
course attentions call theirs through `minidist.models.ATTENTION_FUNCTIONS` the same way):
`kernel(module, q, k, v, attention_mask, dropout=, scaling=, sliding_window=)` with q, k, v
[b, heads, s/c, d] -> ([b, s/c, heads, d], None). The module's projections, rotary, scale
and sliding window stay its own; the kernel reads the ring from the module (`cp_ring`:
the group, the split's layout, the whole sequence's length) and runs `ring_attention`,
causal by global position. Grouped-query K/V are repeated to the query heads first (as
the model's SDPA path does); latent attention's narrower V is padded with zero columns.
Not supported (refused): attention dropout, soft-capping.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .ring import ring_attention

NAME = "minidist_ring"  # its name in a kernel registry


def ring_attention_kernel(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask=None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    group, layout, seq = module.cp_ring
    if dropout:
        raise ValueError(f"ring attention: attention dropout {dropout} is not supported (use 0)")
    if kwargs.get("softcap") is not None:
        raise ValueError("ring attention: attention soft-capping is not supported")
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # one K/V head per query head (the model's SDPA path does the same)
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    dv = value.shape[-1]
    if dv != query.shape[-1]:  # latent attention's V is narrower than Q·K: zero columns
        value = F.pad(value, (0, query.shape[-1] - dv))
    out = ring_attention(
        query, key, value, group, layout, seq, scale=scaling, window=sliding_window
    )
    return out[..., :dv].transpose(1, 2).contiguous(), None
