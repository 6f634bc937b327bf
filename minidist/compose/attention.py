"""Attention in a composed layout: the model's projections, the rank's heads, ring attention.

The one module whose arithmetic changes with the layout (step 3 of `parallelize`): its
projections are the model's own (made tensor parallel by the plan, lesson 07), and it adds
- the rank's heads: q, k, v viewed as [b, heads here, s, head_dim] from the projections'
  output (as Hugging Face's Llama does), K and V of grouped-query attention picked for this
  rank's query heads (split with them, or taken from a replicated projection);
- rotary positions at the tokens' **global** positions (`ctx.positions`: under context
  parallelism a rank holds zig-zag chunks of the sequence, Su et al. 2021 section 3.4);
- causal attention over the whole sequence: lesson 15's `ring_attention` over the cp group
  (zig-zag split, Liu et al. 2023 section 3), or `scaled_dot_product_attention` when cp = 1.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..context_parallel.ring import ring_attention
from ..models_llama import apply_rotary


class Positions:
    """The global positions of this rank's tokens, shared by a stage's attention layers."""

    def __init__(self, positions: torch.Tensor, seq: int):
        self.positions, self.seq = positions, seq


class ComposedAttention(nn.Module):
    """`dense`'s projections (GPT: `qkv`, `proj`; Llama: `q_proj` ... `o_proj`), attention
    over `cp_group` (None: one rank holds the whole sequence)."""

    def __init__(
        self,
        dense: nn.Module,
        ctx: Positions,
        heads: int,
        kv_heads: int,
        head_dim: int,
        rope_theta: float | None,
        tp_group,
        cp_group,
    ):
        super().__init__()
        self.fused = hasattr(dense, "qkv")
        names = ("qkv", "proj") if self.fused else ("q_proj", "k_proj", "v_proj", "o_proj")
        for n in names:
            setattr(self, n, getattr(dense, n))
        self.ctx, self.head_dim, self.rope_theta, self.cp_group = (
            ctx,
            head_dim,
            rope_theta,
            cp_group,
        )
        t = dist.get_world_size(tp_group) if tp_group is not None else 1
        r = dist.get_rank(tp_group) if tp_group is not None else 0
        local_q = heads // t
        kv_split = not self.fused and hasattr(self.k_proj.weight, "tp_split")
        kv_first = r * (kv_heads // t) if kv_split or self.fused else 0
        query = torch.arange(r * local_q, (r + 1) * local_q, device="cpu")
        # the KV head each of this rank's query heads reads, as an index into what it holds
        self.register_buffer("kv_index", query // (heads // kv_heads) - kv_first, persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        # `positions` (a Llama layer passes its own): ignored, the tokens' global positions
        # are `ctx.positions`
        if self.fused:
            qkv = self.qkv(x)
            q, k, v = qkv.split(qkv.shape[-1] // 3, dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        b, s = q.shape[:2]  # the rank's whole cp-local sequence, also under sp
        q, k, v = (t.view(b, s, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        if self.rope_theta is not None:
            pos = self.ctx.positions.to(q.device)
            q, k = apply_rotary(q, pos, self.rope_theta), apply_rotary(k, pos, self.rope_theta)
        index = self.kv_index.to(q.device)
        k, v = k.index_select(1, index), v.index_select(1, index)
        if self.cp_group is not None:
            y = ring_attention(q, k, v, self.cp_group, "zigzag", self.ctx.seq)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = self.proj if self.fused else self.o_proj
        return out(y.transpose(1, 2).reshape(b, s, -1))
