"""The models the course trains: a small MLP and a small GPT with tied embeddings.

The GPT follows nanoGPT (Karpathy) and GPT-2 (Radford et al. 2019): token + position
embeddings, pre-LayerNorm blocks of causal self-attention and an MLP, and an output head
that reuses the token embedding matrix (weight tying, Press & Wolf 2017), which is the tied
parameter data parallelism and pipelines must handle. Dropout is off by default so that
runs are deterministic and comparable across layouts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class MLPConfig:
    in_dim: int = 32
    hidden: int = 64
    out_dim: int = 8
    layers: int = 3


class MLP(nn.Module):
    """`layers` Linear layers with GELU between them; the hidden layers are `self.layers`."""

    def __init__(self, cfg: MLPConfig | None = None):
        super().__init__()
        cfg = cfg or MLPConfig()
        dims = [cfg.in_dim] + [cfg.hidden] * (cfg.layers - 1) + [cfg.out_dim]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = F.gelu(x)
        return x


@dataclass
class GPTConfig:
    vocab_size: int = 64
    seq_len: int = 32
    layers: int = 2
    heads: int = 2
    hidden: int = 32
    dropout: float = 0.0


def sdpa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Causal attention of q, k, v [b, heads, s, d] -> ([b, s, heads, d], None): torch's
    `scaled_dot_product_attention`, in the form of transformers' attention interface."""
    y = F.scaled_dot_product_attention(
        query, key, value, is_causal=True, dropout_p=dropout, scale=scaling
    )
    return y.transpose(1, 2).contiguous(), None


# The attention kernels by name, as transformers' `AttentionInterface`: a course attention
# calls `ATTENTION_FUNCTIONS[self.attn_implementation]`, the one call lesson 17's context
# parallelism swaps (for ring attention) while the module's own forward runs.
ATTENTION_FUNCTIONS = {"sdpa": sdpa_attention}


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.hidden % cfg.heads:
            raise ValueError(
                f"GPTConfig: hidden={cfg.hidden} must be divisible by heads={cfg.heads}"
            )
        self.heads, self.head_dim = cfg.heads, cfg.hidden // cfg.heads
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.dropout = cfg.dropout
        self.attn_implementation = "sdpa"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the heads read from the projection's width (a tensor-parallel rank holds some), the
        # sequence from its output (under sequence parallelism x is a block of it)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        b, s = q.shape[:2]
        q, k, v = (t.view(b, s, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        drop = self.dropout if self.training else 0.0
        y, _ = ATTENTION_FUNCTIONS[self.attn_implementation](self, q, k, v, None, dropout=drop)
        return self.proj(y.reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.hidden, 4 * cfg.hidden), nn.GELU(), nn.Linear(4 * cfg.hidden, cfg.hidden)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A small decoder-only transformer; `lm_head.weight` *is* `tok_emb.weight`."""

    def __init__(self, cfg: GPTConfig | None = None):
        super().__init__()
        cfg = cfg or GPTConfig()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                # GPT-2: scale residual projections by 1/sqrt(2L)
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.layers))

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of `idx` [b, s]; `position_ids` ([s], or Hugging Face's [b, s] of equal
        rows) the tokens' positions, 0..s-1 by default (under context parallelism a rank's
        tokens sit elsewhere in the sequence)."""
        b, s = idx.shape
        if s > self.cfg.seq_len:
            raise ValueError(f"GPT: sequence length {s} exceeds cfg.seq_len={self.cfg.seq_len}")
        if position_ids is None:
            pos = torch.arange(s, device=idx.device)
        else:
            pos = position_ids[0] if position_ids.dim() == 2 else position_ids
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def require_course_gpt(model: nn.Module, who: str, made_by: str = "minidist.models.GPT") -> None:
    """Refuse, before anything happens, a model that is not the course GPT in a wrapper built
    on that model's parts (`tok_emb`, `blocks`, `ln_f`, `lm_head`, `cfg`)."""
    if not isinstance(model, GPT):
        raise TypeError(
            f"{who} takes the course GPT ({made_by}), whose parts it is built on (cfg, "
            f"tok_emb, pos_emb, blocks, ln_f, lm_head); got a {type(model).__name__}. For a "
            "model of your own (a Hugging Face Llama or GPT-2, any forward), use the composable "
            "API minidist.parallelize (lesson 17), which swaps modules by name and leaves "
            "your forward alone."
        )


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy over every position of the batch."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def count_params(model: nn.Module) -> int:
    """Parameters counted once each (a tied weight counts once)."""
    return sum(p.numel() for p in model.parameters())
