"""A small Llama-style model in Hugging Face's layout (lesson 17's third model).

Touvron et al. 2023, "LLaMA" (section 2.2) and Dubey et al. 2024, "The Llama 3 Herd of
Models" (section 3.2): pre-normalisation with RMSNorm (Zhang & Sennrich 2019), rotary
position embeddings (Su et al. 2021, "RoFormer", section 3.4), the SwiGLU feed-forward
(Shazeer 2020, "GLU Variants Improve Transformer": down(silu(gate(x)) · up(x))), grouped-
query attention (Ainslie et al. 2023, "GQA": `kv_heads` key/value heads, each shared by
heads/kv_heads query heads), no biases, and an output head not tied to the embedding.

The module names are Hugging Face's `LlamaForCausalLM`'s (`model.embed_tokens`,
`model.layers.N.self_attn.{q,k,v,o}_proj`, `mlp.{gate,up,down}_proj`, `input_layernorm`,
`post_attention_layernorm`, `model.norm`, `lm_head`), so a parallelisation plan written
for these names applies to a Hugging Face checkpoint's model as it is. Attention reads its
head count from the projections' output (`view(b, s, -1, head_dim)`, as Hugging Face's
does), so it also runs on a tensor-parallel rank's heads. `positions` (the tokens' global
positions, for rotary) default to 0..s-1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .models import ATTENTION_FUNCTIONS


@dataclass
class LlamaConfig:
    vocab_size: int = 64
    seq_len: int = 32
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    hidden: int = 32
    ffn: int = 64
    rope_theta: float = 10000.0
    eps: float = 1e-5


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · weight (Zhang & Sennrich 2019), in float32."""

    def __init__(self, hidden: int, eps: float = 1e-5, device="cpu"):
        super().__init__()  # built where the caller says (the CPU, or "meta" when large)
        self.weight, self.eps = nn.Parameter(torch.ones(hidden, device=device)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE on x [b, heads, s, d] at `positions` [s] (Hugging Face's rotate-half form)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angles = positions.to(torch.float32)[:, None] * inv[None, :]
    emb = torch.cat([angles, angles], dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1)
    return x * cos + half * sin


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        if cfg.hidden % cfg.heads or cfg.heads % cfg.kv_heads:
            raise ValueError(
                f"LlamaConfig: heads={cfg.heads} must divide hidden={cfg.hidden} and be a "
                f"multiple of kv_heads={cfg.kv_heads}"
            )
        self.head_dim, self.rope_theta = cfg.hidden // cfg.heads, cfg.rope_theta
        self.attn_implementation = "sdpa"  # the kernel by name (`models.ATTENTION_FUNCTIONS`)
        kv = cfg.kv_heads * self.head_dim
        self.q_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.k_proj = nn.Linear(cfg.hidden, kv, bias=False)
        self.v_proj = nn.Linear(cfg.hidden, kv, bias=False)
        self.o_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (
            p(x).view(b, s, -1, self.head_dim).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        pos = torch.arange(s, device=x.device) if positions is None else positions
        q, k = apply_rotary(q, pos, self.rope_theta), apply_rotary(k, pos, self.rope_theta)
        groups = q.shape[1] // k.shape[1]  # query heads per K/V head, from what is held here
        k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))
        y, _ = ATTENTION_FUNCTIONS[self.attn_implementation](self, q, k, v, None)
        return self.o_proj(y.reshape(b, s, -1))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.up_proj = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.down_proj = nn.Linear(cfg.ffn, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.eps)


class LlamaForCausalLM(nn.Module):
    """`model` (embeddings, layers, norm) and an untied `lm_head`; forward(ids) -> logits
    (`position_ids`, [s] or Hugging Face's [b, s] of equal rows: the tokens' positions)."""

    def __init__(self, cfg: LlamaConfig | None = None):
        super().__init__()
        cfg = cfg or LlamaConfig()
        self.cfg = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        use_cache: bool = False,
    ) -> torch.Tensor:
        positions = (
            position_ids[0]
            if position_ids is not None and position_ids.dim() == 2
            else (position_ids)
        )
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x, positions)
        return self.lm_head(self.model.norm(x))
