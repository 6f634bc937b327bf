"""Models nobody in minidist wrote, in Hugging Face's layout, for tests that use minidist as a
researcher would on their own model (issue 26). Reusable: import them from any test.

- `Llama`: a small HF-layout Llama (`LlamaForCausalLM`'s module names: model.embed_tokens,
  model.layers.i.{self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, input_layernorm,
  post_attention_layernorm}, model.norm, lm_head), RMSNorm, rotary embedding with an fp32
  `inv_freq` buffer, SwiGLU, grouped-query attention; `forward(input_ids,
  attention_mask=None, labels=None)` returns a `CausalLMOutput` (`.loss`, `.logits`) and its
  decoder layers take `attention_mask=` and `position_embeddings=` as keywords.
- `GPT2`: GPT-2's layout (transformer.wte/wpe/h.i/ln_f, lm_head) with `lm_head.weight`
  tied to `transformer.wte.weight`, blocks called with `attention_mask=`.
- `CausalLMOutput`: like HF's `ModelOutput`: a dataclass that is also an OrderedDict
  (attribute and key access, only the fields that are not None as keys).
- `encoder()`: torch's own `nn.TransformerEncoder`, called with `mask=`.
- `batches(...)`: token batches (input_ids, labels) for these models.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelOutput(OrderedDict):
    """HF's `transformers.utils.ModelOutput`, reduced: a dataclass subclass of OrderedDict
    whose keys are its fields that are not None; attributes and keys stay in sync."""

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                self[f.name] = value

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def __setattr__(self, name, value):
        if name in self.keys() and value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)

    def to_tuple(self) -> tuple:
        return tuple(self[k] for k in self.keys())


@dataclass
class CausalLMOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None


@dataclass
class LlamaConfig:
    vocab_size: int = 64
    hidden_size: int = 32
    intermediate_size: int = 48
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 64


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


class LlamaRotaryEmbedding(nn.Module):
    """cos/sin of the positions, computed in fp32 from the `inv_freq` buffer (as HF does)."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        dim = cfg.hidden_size // cfg.num_attention_heads
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        freqs = position_ids[..., None].float() * self.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _attention(q, k, v, attention_mask, causal_len: int) -> torch.Tensor:
    """Causal attention; `attention_mask` (batch, seq) of 1 = keep, 0 = padding."""
    mask = torch.ones(causal_len, causal_len, dtype=torch.bool, device=q.device).tril()
    if attention_mask is not None:
        mask = mask & attention_mask[:, None, None, :].bool()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.head_dim = cfg.hidden_size // cfg.num_attention_heads
        self.groups = cfg.num_attention_heads // cfg.num_key_value_heads
        kv = cfg.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, kv, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, kv, bias=False)
        self.o_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)

    def forward(self, hidden_states, position_embeddings, attention_mask=None):
        b, s, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(b, s, -1, self.head_dim).transpose(1, 2)
        cos, sin = (t.unsqueeze(1) for t in position_embeddings)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        k, v = k.repeat_interleave(self.groups, 1), v.repeat_interleave(self.groups, 1)
        y = _attention(q, k, v, attention_mask, s)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, -1))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.self_attn = LlamaAttention(cfg)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, hidden_states, attention_mask=None, position_embeddings=None):
        h = hidden_states + self.self_attn(
            self.input_layernorm(hidden_states), position_embeddings, attention_mask
        )
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(cfg)

    def forward(self, input_ids, attention_mask=None):
        h = self.embed_tokens(input_ids)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        rotary = self.rotary_emb(h, positions)
        for layer in self.layers:
            h = layer(h, attention_mask=attention_mask, position_embeddings=rotary)
        return self.norm(h)


def _causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """HF's shift: position t predicts token t+1."""
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1)
    )


class Llama(nn.Module):
    """`LlamaForCausalLM`'s layout and call: `Llama(cfg)(input_ids, labels=input_ids).loss`."""

    def __init__(self, cfg: LlamaConfig | None = None):
        super().__init__()
        self.config = cfg or LlamaConfig()
        self.model = LlamaModel(self.config)
        self.lm_head = nn.Linear(self.config.hidden_size, self.config.vocab_size, bias=False)

    def forward(self, input_ids, attention_mask=None, labels=None) -> CausalLMOutput:
        logits = self.lm_head(self.model(input_ids, attention_mask=attention_mask))
        loss = _causal_lm_loss(logits, labels) if labels is not None else None
        return CausalLMOutput(loss=loss, logits=logits)


@dataclass
class GPT2Config:
    vocab_size: int = 64
    n_positions: int = 32
    n_embd: int = 32
    n_layer: int = 2
    n_head: int = 4


class GPT2Block(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.heads = cfg.n_head
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.mlp_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, hidden_states, attention_mask=None):
        b, s, h = hidden_states.shape
        q, k, v = self.c_attn(self.ln_1(hidden_states)).split(h, dim=2)
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        y = _attention(q, k, v, attention_mask, s).transpose(1, 2).reshape(b, s, h)
        hidden_states = hidden_states + self.c_proj(y)
        return hidden_states + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(hidden_states))))


class GPT2Transformer(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.h = nn.ModuleList(GPT2Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)

    def forward(self, input_ids, attention_mask=None):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        h = self.wte(input_ids) + self.wpe(positions)
        for block in self.h:
            h = block(h, attention_mask=attention_mask)
        return self.ln_f(h)


class GPT2(nn.Module):
    """`GPT2LMHeadModel`'s layout: `lm_head.weight is transformer.wte.weight` (tied)."""

    def __init__(self, cfg: GPT2Config | None = None):
        super().__init__()
        self.config = cfg or GPT2Config()
        self.transformer = GPT2Transformer(self.config)
        self.lm_head = nn.Linear(self.config.n_embd, self.config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, input_ids, attention_mask=None, labels=None) -> CausalLMOutput:
        logits = self.lm_head(self.transformer(input_ids, attention_mask=attention_mask))
        loss = _causal_lm_loss(logits, labels) if labels is not None else None
        return CausalLMOutput(loss=loss, logits=logits)


def encoder(d_model: int = 32, nhead: int = 4, layers: int = 2) -> nn.TransformerEncoder:
    """torch's own encoder (dropout off, batch first), called as `enc(x, mask=...)`."""
    layer = nn.TransformerEncoderLayer(
        d_model, nhead, dim_feedforward=64, dropout=0.0, batch_first=True
    )
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


def init_weights(model: nn.Module, std: float = 0.02) -> nn.Module:
    """HF's `_init_weights`: Linear and Embedding weights N(0, std), biases zero."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
    return model


def build(name: str, seed: int = 0) -> nn.Module:
    """ "llama", "gpt2" or "encoder", with the same parameters wherever it is built."""
    torch.manual_seed(seed)
    model = {"llama": Llama, "gpt2": GPT2, "encoder": encoder}[name]()
    return init_weights(model) if name != "encoder" else model


def batches(steps: int = 3, batch: int = 8, seq: int = 16, vocab: int = 64, seed: int = 1):
    """`steps` global batches of token ids (batch, seq), each its own labels."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (batch, seq), generator=g) for _ in range(steps)]
