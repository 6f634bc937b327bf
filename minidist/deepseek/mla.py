"""Multi-head latent attention at inference: what it caches, and attention from that cache
alone (DeepSeek-V3 §2.1.1; DeepSeek-V2, arXiv:2405.04434, §2.1 and Table 1).

Per token MLA caches the compressed latent c_KV = RMSNorm(W_DKV h) (kv_lora_rank = d_c
numbers) and one rotary key k^R = RoPE(W_KR h) shared by all heads (qk_rope_head_dim =
d_h^R), where multi-head attention caches 2·n_h·d_h. The per-head keys and values are
W_UK c_KV and W_UV c_KV; at inference W_UK is absorbed into the query (q·W_UK c = (W_UK^T q)·c)
and W_UV into the output projection (W_O W_UV), so no per-head key or value is ever formed.
The functions work on a transformers `DeepseekV3Attention`; its weights are read, not changed.
Not here: a cache object for generation, dropout, yarn's rotary scaling (the module's
`scaling` is used as it is), batching of queries of different lengths.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def _rotate(attn: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """x [b, heads, s, d^R] with rotary at the positions of cos/sin [b, s, d^R], in the
    module's own layout (interleaved pairs when `rope_interleave`)."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as m

    rotary = (
        m.apply_rotary_pos_emb_interleave if attn.config.rope_interleave else m.apply_rotary_pos_emb
    )
    return rotary(x, x, cos, sin)[0]


def latent_cache(
    attn: nn.Module, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """What MLA caches for each token of hidden_states [b, s, hidden]: (c_KV [b, s, d_c],
    after kv_a_layernorm; k^R [b, s, d_h^R], rotary applied, one for all heads)."""
    latent, key_rope = torch.split(
        attn.kv_a_proj_with_mqa(hidden_states), [attn.kv_lora_rank, attn.qk_rope_head_dim], dim=-1
    )
    key_rope = _rotate(attn, key_rope.unsqueeze(1), cos, sin).squeeze(1)
    return attn.kv_a_layernorm(latent), key_rope


def _queries(attn: nn.Module, hidden_states: torch.Tensor, cos, sin):
    """(q^C [b, n_h, s, d_nope], q^R [b, n_h, s, d^R] rotated): the module's query path."""
    b, s, _ = hidden_states.shape
    if attn.q_lora_rank is None:
        q = attn.q_proj(hidden_states)
    else:  # queries through their own latent c_Q too (training memory, not the cache)
        q = attn.q_b_proj(attn.q_a_layernorm(attn.q_a_proj(hidden_states)))
    q = q.view(b, s, attn.num_heads, attn.qk_head_dim).transpose(1, 2)
    q_nope, q_rope = torch.split(q, [attn.qk_nope_head_dim, attn.qk_rope_head_dim], dim=-1)
    return q_nope, _rotate(attn, q_rope, cos, sin)


def attention_from_cache(
    attn: nn.Module,
    hidden_states: torch.Tensor,
    cache: tuple[torch.Tensor, torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The attention output [b, q, hidden] of the q query tokens hidden_states [b, q, hidden]
    (cos/sin at their positions) over the t ≥ q cached tokens `cache` = (c_KV [b, t, d_c],
    k^R [b, t, d^R]), the queries being the last q of them: causal unless `attention_mask`
    (additive, [b, 1, q, t]) is given. Keys and values are never expanded per head."""
    latent, key_rope = cache
    b, q_len, _ = hidden_states.shape
    t = latent.shape[1]
    h, d_nope, d_v = attn.num_heads, attn.qk_nope_head_dim, attn.v_head_dim
    q_nope, q_rope = _queries(attn, hidden_states, cos, sin)
    up = attn.kv_b_proj.weight.view(h, d_nope + d_v, attn.kv_lora_rank)
    up_key, up_value = up[:, :d_nope], up[:, d_nope:]  # W_UK [h, d_nope, d_c], W_UV [h, d_v, d_c]
    q_latent = torch.einsum("bhsn,hnc->bhsc", q_nope, up_key)  # W_UK absorbed: W_UK^T q^C
    scores = torch.einsum("bhsc,btc->bhst", q_latent, latent)
    scores = (scores + torch.einsum("bhsr,btr->bhst", q_rope, key_rope)) * attn.scaling
    if attention_mask is None:  # query i sits at position t - q + i of the cache
        later = torch.ones(q_len, t, dtype=torch.bool, device=latent.device).triu(t - q_len + 1)
        scores = scores.masked_fill(later, float("-inf"))
    else:
        scores = scores + attention_mask
    weights = torch.softmax(scores, dim=-1)
    mixed = torch.einsum("bhst,btc->bhsc", weights, latent)  # Σ_t p_t c_t, still latent
    out_w = attn.o_proj.weight.view(-1, h, d_v)
    absorbed = torch.einsum("ohv,hvc->ohc", out_w, up_value)  # W_UV absorbed: W_O,h · W_UV,h
    return F.linear(
        mixed.transpose(1, 2).reshape(b, q_len, h * attn.kv_lora_rank),
        absorbed.reshape(-1, h * attn.kv_lora_rank),
        attn.o_proj.bias,
    )


def cache_elements_per_token(
    kind: str,
    layers: int,
    heads: int = 0,
    head_dim: int = 0,
    groups: int = 0,
    latent: int = 0,
    rope_dim: int = 0,
) -> int:
    """KV cache elements per token over `layers` layers (DeepSeek-V2 Table 1): "mha"
    2·n_h·d_h·l, "gqa" 2·n_g·d_h·l, "mqa" 2·d_h·l, "mla" (d_c + d_h^R)·l."""
    per_layer = {
        "mha": 2 * heads * head_dim,
        "gqa": 2 * groups * head_dim,
        "mqa": 2 * head_dim,
        "mla": latent + rope_dim,
    }
    if kind not in per_layer:
        raise ValueError(
            f"cache_elements_per_token: kind={kind!r} must be one of {list(per_layer)}"
        )
    return per_layer[kind] * layers


def model_cache_elements(config) -> dict[str, float]:
    """A transformers DeepSeek-V3 `config`'s cache per token: MLA's and multi-head
    attention's with d_h = qk_nope_head_dim (the paper's d_h), per layer and over all
    layers, and the GQA group count that would cache as much (V2: 2.25 for d_c = 4·d_h,
    d_h^R = d_h/2). DeepSeek-V3 (d_c 512, d_h^R 64, n_h 128, d_h 128, 61 layers): 576
    against 32,768 per layer."""
    layers, heads, d_h = (
        config.num_hidden_layers,
        config.num_attention_heads,
        config.qk_nope_head_dim,
    )
    mla = cache_elements_per_token(
        "mla", 1, latent=config.kv_lora_rank, rope_dim=config.qk_rope_head_dim
    )
    mha = cache_elements_per_token("mha", 1, heads=heads, head_dim=d_h)
    return {
        "mla_per_layer": mla,
        "mha_per_layer": mha,
        "mla": mla * layers,
        "mha": mha * layers,
        "ratio": mha / mla,
        "gqa_groups_equal": mla / (2 * d_h),
    }
