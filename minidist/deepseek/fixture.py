"""Lesson 19's model, the same everywhere: the notebook, the tour row, the routing picture
(`moe.load_over_steps`) and the trainer (`--model minidist.deepseek.fixture:tiny_deepseek_v3`)."""

from __future__ import annotations


def tiny_deepseek_v3(seed: int = 0, **overrides):
    """The lesson's model (random weights, nothing downloaded): 4 layers of hidden size 32,
    the first dense, then 8 routed experts in 4 groups (nodes), 2 of them per token from at
    most 2 groups, one shared expert; latent attention with d_c = 8, d_h^R = 4; its weights
    drawn after `torch.manual_seed(seed)`. `overrides` change any field of the
    `DeepseekV3Config`."""
    import torch
    import transformers

    torch.manual_seed(seed)
    sizes = dict(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=4,
        topk_group=2,
        first_k_dense_replace=1,
        q_lora_rank=16,
        kv_lora_rank=8,
        qk_rope_head_dim=4,
        qk_nope_head_dim=8,
        v_head_dim=8,
        max_position_embeddings=64,
    )
    config = transformers.DeepseekV3Config(**{**sizes, **overrides})
    return transformers.DeepseekV3ForCausalLM(config)
