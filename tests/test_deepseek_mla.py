"""Latent attention from its cache alone equals transformers' DeepseekV3Attention."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from worlds import HUNG_S

from minidist.deepseek.mla import (
    attention_from_cache,
    cache_elements_per_token,
    latent_cache,
    model_cache_elements,
)

transformers = pytest.importorskip("transformers")
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf  # noqa: E402


def attention(
    dtype=torch.float64,
    heads=4,
    q_lora=16,
    d_c=8,
    rope=4,
    nope=8,
    v=8,
    interleave=True,
    hidden=32,
    bias=False,
    seed=0,
):
    """(DeepseekV3Attention, its rotary embedding): random weights, the norms' too."""
    cfg = transformers.DeepseekV3Config(
        vocab_size=16,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        q_lora_rank=q_lora,
        kv_lora_rank=d_c,
        qk_rope_head_dim=rope,
        qk_nope_head_dim=nope,
        v_head_dim=v,
        rope_interleave=interleave,
        attention_bias=bias,
        num_hidden_layers=1,
        max_position_embeddings=64,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    attn = hf.DeepseekV3Attention(cfg, 0).to(dtype).eval()
    with torch.no_grad():
        for p in attn.parameters():  # the norms' weights too, so a skipped norm shows
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    return attn, hf.DeepseekV3RotaryEmbedding(cfg)


def inputs(attn, rotary, batch, seq, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq, attn.hidden_size, generator=g, dtype=dtype)
    cos, sin = rotary(x, torch.arange(seq)[None].expand(batch, seq))
    return x, cos, sin


def compare(attn, rotary, batch, seq, dtype, last=None):
    """(ours, transformers') outputs of the last `last` queries (all by default)."""
    x, cos, sin = inputs(attn, rotary, batch, seq, dtype)
    with torch.no_grad():
        want = attn(x, position_embeddings=(cos, sin), attention_mask=None)[0]
        cache = latent_cache(attn, x, cos, sin)
        q = slice(seq - (last or seq), seq)
        got = attention_from_cache(attn, x[:, q], cache, cos[:, q], sin[:, q])
    return got, want[:, q]


# float64: the absorbed form only reorders sums (~1e-16 relative per operation, products of
# ~10 terms), so 1e-10 leaves room and still shows any wrong weight (differences ~1e-1).
F64 = dict(rtol=1e-10, atol=1e-10)
# float32: rounding of the reordered sums (~1e-7 relative, outputs ~1): 1e-5 absolute.
F32 = dict(rtol=1e-4, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(
    heads=st.integers(1, 5),
    q_lora=st.one_of(st.none(), st.integers(1, 12)),
    d_c=st.integers(1, 11),
    rope=st.sampled_from([2, 4, 6]),
    nope=st.integers(1, 9),
    v=st.integers(1, 9),
    interleave=st.booleans(),
    bias=st.booleans(),
    seq=st.integers(1, 9),
)
def test_attention_from_cache_equals_transformers_float64(
    heads, q_lora, d_c, rope, nope, v, interleave, bias, seq
):
    attn, rotary = attention(
        torch.float64, heads, q_lora, d_c, rope, nope, v, interleave, hidden=30, bias=bias
    )
    got, want = compare(attn, rotary, 2, seq, torch.float64)
    torch.testing.assert_close(got, want, **F64)


@pytest.mark.parametrize("q_lora,interleave", [(16, True), (None, False), (7, False)])
def test_attention_from_cache_float32(q_lora, interleave):
    attn, rotary = attention(
        torch.float32,
        heads=3,
        q_lora=q_lora,
        d_c=6,
        rope=6,
        nope=5,
        v=7,
        interleave=interleave,
        hidden=30,
    )
    got, want = compare(attn, rotary, 2, 11, torch.float32)
    torch.testing.assert_close(got, want, **F32)


@pytest.mark.parametrize("last", [1, 3])
def test_decoding_queries_see_the_whole_cache(last):
    """The last `last` tokens as queries over all 9 cached ones (a decoding step)."""
    attn, rotary = attention(heads=3, q_lora=None, d_c=5, rope=4, nope=3, v=5, hidden=30)
    got, want = compare(attn, rotary, 2, 9, torch.float64, last=last)
    torch.testing.assert_close(got, want, **F64)


def test_the_cache_holds_latent_and_one_rotary_key_per_token():
    attn, rotary = attention(heads=3, d_c=6, rope=4)
    x, cos, sin = inputs(attn, rotary, 2, 7, torch.float64)
    latent, key_rope = latent_cache(attn, x, cos, sin)
    assert latent.shape == (2, 7, 6) and key_rope.shape == (2, 7, 4)
    # the latent is normed: RMS(c / γ) = 1 per token
    rms = (latent / attn.kv_a_layernorm.weight).pow(2).mean(-1).sqrt()
    torch.testing.assert_close(rms, torch.ones_like(rms), rtol=1e-5, atol=1e-5)
    # the rotary key at position 0 is unrotated (cos 1, sin 0)
    raw = attn.kv_a_proj_with_mqa(x)[..., 6:]
    first = hf.apply_rotary_pos_emb_interleave(
        raw[:, None, :1], raw[:, None, :1], cos[:, :1], sin[:, :1]
    )[0][:, 0]
    torch.testing.assert_close(key_rope[:, :1], first)


def test_cache_elements_table_and_deepseek_v3():
    # DeepSeek-V2 Table 1, per layer, with DeepSeek-V3's sizes
    assert cache_elements_per_token("mha", 1, heads=128, head_dim=128) == 32_768
    assert cache_elements_per_token("gqa", 2, groups=8, head_dim=128) == 2 * 2 * 8 * 128
    assert cache_elements_per_token("mqa", 3, head_dim=128) == 3 * 2 * 128
    assert cache_elements_per_token("mla", 61, latent=512, rope_dim=64) == 576 * 61
    with pytest.raises(ValueError, match="kind='mlA'"):
        cache_elements_per_token("mlA", 1)
    v3 = model_cache_elements(transformers.DeepseekV3Config())  # the published defaults
    assert v3["mla_per_layer"] == 576 and v3["mha_per_layer"] == 32_768
    assert v3["mla"] == 576 * 61 and v3["mha"] == 32_768 * 61
    assert v3["gqa_groups_equal"] == 2.25  # V2 §2.1.4: as GQA with 2.25 groups


def test_latent_attention_under_tp_2_equals_one_process():
    """tp 2 (and with sp, queries without their latent): q_b_proj / q_proj and kv_b_proj
    split by heads, o_proj by rows, the latents and the rotary key whole on each rank (their
    gradients summed over tp). All layers dense (experts under tp are not composed).
    Tolerances as tests/test_compose_hf.py's (losses 1e-5, parameters 1e-3, Adam 1e-5);
    measured 4.8e-7, 5.4e-5, 1.1e-7."""
    import hf_runs

    import minidist
    from minidist.training import max_abs_diff

    dense = {"first_k_dense_replace": 4}
    runs = [
        ("deepseek_v3", dict(tp=2), dense),
        ("deepseek_v3", dict(tp=2, sp=True), {**dense, "q_lora_rank": None}),
    ]
    got = minidist.launch(hf_runs.several, 2, runs, timeout_s=600, idle_s=HUNG_S)[0]
    for (name, _, extra), result in zip(runs, got):
        want = hf_runs.reference(name, **extra)
        assert result["losses"] == pytest.approx(want["losses"], abs=1e-5)
        assert max_abs_diff(result["params"], want["params"]) < 1e-3
        assert max_abs_diff(result["optim"], want["optim"]) < 1e-5
