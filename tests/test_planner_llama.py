"""The planner on lesson 17's Llama-style model: parameter counts of published models, FLOPs
that reduce to the GPT's, and one process's activations equal to what autograd saves."""

import pytest
import torch

from minidist.megatron import theory as tp_theory
from minidist.memory import SavedActivations
from minidist.models import lm_loss
from minidist.models_llama import LlamaConfig, LlamaForCausalLM
from minidist.planner import Layout, ModelSpec, plan
from minidist.planner import llama as planner_llama

LLAMA2_7B = dict(layers=32, hidden=4096, heads=32, vocab=32000, seq=4096, kv_heads=32, ffn=11008)
LLAMA3_405B = dict(
    layers=126, hidden=16384, heads=128, vocab=128256, seq=8192, kv_heads=8, ffn=53248
)


@pytest.mark.parametrize(
    "cfg, params",
    [(LLAMA2_7B, 6_738_415_616), (LLAMA3_405B, 405_853_388_800)],
)
def test_published_llamas_have_their_parameter_counts(cfg, params):
    """Llama 2 7B (Touvron et al. 2023b, 6.74 B) and Llama 3 405B (Dubey et al. 2024, Table 3):
    untied embeddings, three MLP matrices, grouped-query K/V (the course GPT's count of the
    same sizes, 6.59e9 for the 7B, is what the planner used to give)."""
    assert ModelSpec(arch="llama", **cfg).num_params == params


@pytest.mark.parametrize("b, s", [(1, 8), (3, 64), (8, 2048)])
def test_llama_flops_with_two_thirds_of_4h_are_the_gpts(b, s):
    """SwiGLU's three matrices of 8h/3 units hold the GPT MLP's 8h² weights: the same FLOPs."""
    h = 96
    spec = ModelSpec(
        arch="llama", layers=1, hidden=h, heads=8, vocab=10, seq=s, kv_heads=8, ffn=8 * h // 3
    )
    assert planner_llama.layer_flops(spec, b, s) == tp_theory.transformer_layer_flops(b, s, h)


@pytest.mark.parametrize(
    "b, s, h, a, kv, f, vocab, layers",
    [(2, 8, 16, 4, 2, 32, 64, 2), (3, 16, 32, 8, 8, 48, 100, 1), (1, 12, 24, 6, 1, 40, 50, 3)],
)
def test_one_process_llama_activations_equal_what_autograd_saves(b, s, h, a, kv, f, vocab, layers):
    """Exact, float32: every layer's norms, rotary tables, attention and SwiGLU tensors, the
    embedding's indices, the final norm, the head and the loss."""
    cfg = LlamaConfig(vocab, s, layers, a, kv, h, f)
    model = LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, vocab, (b, s), generator=g) for _ in range(2))
    with SavedActivations(model) as saved:
        lm_loss(model(x), y)
    planned = plan(ModelSpec.of(model), Layout(global_batch=b)).memory["activations"]
    assert planned == saved.bytes


def test_tensor_parallel_llama_keeps_kv_whole_when_t_does_not_divide_them():
    spec = ModelSpec(
        arch="llama", layers=2, hidden=64, heads=8, vocab=100, seq=16, kv_heads=2, ffn=96
    )
    kv = 64 * 2 * 8  # h × kv_heads · head_dim
    for tp, split in ((2, True), (4, False), (8, False)):
        assert planner_llama.kv_split(spec, tp) is split
        params, _ = planner_llama.stage_params(spec, Layout(dp=1, tp=tp, optimizer="sgd"))
        per_layer_kv = 2 * (kv // tp if split else kv)
        others = (2 * 64 * 64 + 3 * 64 * 96) // tp + 2 * 64  # q, o, MLP split; norms whole
        vocab = -(-100 // tp) * tp * 64 // tp
        assert params == 2 * (per_layer_kv + others) + 2 * vocab + 64


def test_llama_refuses_what_the_planner_does_not_plan_for_it():
    with pytest.raises(ValueError, match="kv_heads"):
        ModelSpec(arch="llama", layers=2, hidden=64, heads=8, vocab=100, seq=16, ffn=96)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        ModelSpec(arch="llama", layers=2, hidden=64, heads=8, vocab=100, seq=16, kv_heads=3, ffn=96)
    with pytest.raises(ValueError, match="arch="):
        ModelSpec(arch="mamba", layers=2, hidden=64, heads=8, vocab=100, seq=16)
    spec = ModelSpec(
        arch="llama", layers=2, hidden=64, heads=8, vocab=100, seq=16, kv_heads=2, ffn=96
    )
    with pytest.raises(ValueError, match="sp=True"):
        plan(spec, Layout(tp=2, sp=True))
