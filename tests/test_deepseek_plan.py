"""Lesson 19's plan of DeepSeek-V3's layout: the counts equal the transformers model's own
parameters (built on the meta device, nothing downloaded), and the routing expectation
equals an enumeration."""

import itertools
import math

import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.deepseek import plan


def tiny(**extra):
    sizes = dict(
        vocab_size=97,
        hidden_size=24,
        intermediate_size=40,
        moe_intermediate_size=12,
        num_hidden_layers=5,
        num_attention_heads=3,
        num_key_value_heads=3,
        n_routed_experts=6,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=3,
        topk_group=2,
        first_k_dense_replace=2,
        q_lora_rank=10,
        kv_lora_rank=6,
        qk_rope_head_dim=4,
        qk_nope_head_dim=6,
        v_head_dim=5,
    )
    return transformers.DeepseekV3Config(**{**sizes, **extra})


def meta_counts(c):
    with torch.device("meta"):
        model = transformers.DeepseekV3ForCausalLM(c)
    named = dict(model.named_parameters())
    total = sum(p.numel() for p in named.values())
    routed = sum(p.numel() for n, p in named.items() if ".mlp.experts." in n)
    return total, routed


@settings(max_examples=12, deadline=None)
@given(
    q_lora=st.sampled_from([None, 7, 10]),
    tied=st.booleans(),
    bias=st.booleans(),
    layers=st.integers(1, 5),
    dense=st.integers(0, 3),
    shared=st.integers(0, 2),
)
def test_counts_equal_the_transformers_model_on_the_meta_device(
    q_lora, tied, bias, layers, dense, shared
):
    c = tiny(
        q_lora_rank=q_lora,
        tie_word_embeddings=tied,
        attention_bias=bias,
        num_hidden_layers=layers,
        first_k_dense_replace=min(dense, layers),
        n_shared_experts=shared,
    )
    counts = plan.parameter_counts(c)
    total, routed = meta_counts(c)
    assert counts["total"] == total
    assert counts["routed experts"] == routed


def test_deepseek_v3_is_671b_with_37b_activated():
    """transformers' default DeepseekV3Config is DeepSeek-V3's: 671.03B parameters (the
    paper's 671B); 37.55B activated per token, 36.63B without the embedding lookup (the
    paper's 37B: our reading of what it counts)."""
    counts = plan.parameter_counts(transformers.DeepseekV3Config())
    assert round(counts["total"] / 1e9) == plan.PAPER["total parameters"] / 1e9
    assert round(counts["activated per token, without the embedding"] / 1e9) == 37


@pytest.mark.parametrize("pp, ep, gpus", [(1, 1, 1), (3, 2, 6), (5, 3, 30), (2, 6, 12)])
def test_the_stages_hold_every_parameter_once_per_expert_group(pp, ep, gpus):
    c = tiny(num_hidden_layers=5)
    recipe = plan.Recipe(gpus=gpus, gpus_per_node=2, pp=pp, ep=ep)
    held = [plan.stage_params(c, recipe, s) for s in range(pp)]
    counts = plan.parameter_counts(c)
    assert sum(h["dense"] for h in held) == counts["total"] - counts["routed experts"]
    assert sum(h["routed experts"] for h in held) * ep == counts["routed experts"]
    assert sum(plan.layers_per_stage(5, pp)) == 5


def test_zero1_shards_only_the_optimizer_states():
    c = tiny()
    one = plan.model_state_bytes(c, plan.Recipe(gpus=1, pp=1, ep=1), 0)
    params = plan.parameter_counts(c)["total"]
    assert one["total"] == (2 + 4 + 8) * params
    wide = plan.model_state_bytes(c, plan.Recipe(gpus=12, pp=1, ep=3), 0)
    held = plan.stage_params(c, plan.Recipe(gpus=12, pp=1, ep=3), 0)
    assert wide["optimizer"] == pytest.approx(8 * (held["dense"] / 12 + held["routed experts"] / 4))
    assert wide["weights"] == 2 * held["total"] and wide["gradients"] == 4 * held["total"]


@pytest.mark.parametrize("experts, nodes, k", [(6, 3, 2), (8, 4, 3), (9, 3, 4), (10, 5, 2)])
def test_expected_nodes_equals_the_enumeration(experts, nodes, k):
    per = experts // nodes
    spans = [len({e // per for e in pick}) for pick in itertools.combinations(range(experts), k)]
    assert plan.expected_nodes(experts, nodes, k) == pytest.approx(sum(spans) / len(spans))


def test_deepseek_v3_routing_traffic():
    """4 nodes at most with node-limited routing against 8 without (and 4.63 expected with
    uniform routing); FP8 dispatch: 7,168 bytes and 56 FP32 scales per token and node."""
    c, recipe = transformers.DeepseekV3Config(), plan.Recipe()
    nodes = plan.remote_nodes(c, recipe)
    assert nodes["node-limited, at most"] == plan.PAPER["nodes a token reaches at most"]
    assert nodes["unlimited, at most"] == 8
    assert nodes["unlimited, uniform routing"] == pytest.approx(4.6328, abs=1e-4)
    assert plan.dispatch_bytes_per_token(c, 1) == 7168 + 4 * 56
    traffic = plan.routing_traffic(c, recipe, tokens=3)
    assert traffic["node-limited, at most"] == (3 * 4 * 7392, 3 * 4 * 2 * 7168)


def test_bad_recipes_are_refused_in_one_line():
    with pytest.raises(ValueError, match="pp=3 · ep=64 must divide gpus=2048"):
        plan.Recipe(pp=3)
    with pytest.raises(ValueError, match="gpus=0"):
        plan.Recipe(gpus=0)
    with pytest.raises(ValueError, match="stage=16"):
        plan.stage_params(tiny(), plan.Recipe(), 16)
    assert math.isclose(plan.Recipe().expert_dp, 2)
