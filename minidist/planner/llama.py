"""Lesson 17's Llama-style model in the planner (`ModelSpec(arch="llama", ...)`).

The terms that differ from the course GPT, each from the model's own structure
(`minidist.models_llama`; Touvron et al. 2023, section 2.2; Dubey et al. 2024, section 3.2):
- parameters per tensor-parallel rank: Megatron's column/row split of `q_proj`, `o_proj` and
  the three SwiGLU matrices, the vocabulary split of `embed_tokens` and `lm_head` (padded to a
  multiple of t), `k_proj` and `v_proj` split when t divides the K/V heads and replicated
  otherwise, the RMSNorm weights whole; no position embedding, and the head is not tied, so
  a pipeline has no embedding group to reduce;
- FLOPs of a layer (Narayanan et al. 2021's appendix count, with grouped-query K/V and three
  MLP matrices of `ffn` units);
- what a layer saves for backward on the course kernels (CPU flash attention, no dropout), as
  autograd's saved-tensor hooks count it (`tests/test_planner_llama.py`).
"""

from __future__ import annotations

from ..three_d import theory as three_d_theory
from .spec import Layout, ModelSpec

SPLIT = ("q_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # 1/t of each
KV = ("k_proj", "v_proj")  # 1/t when t divides kv_heads, else whole on every tp rank
VOCAB = ("embed_tokens", "lm_head")  # rows of the padded vocabulary, 1/t each


def kv_split(model: ModelSpec, tp: int) -> bool:
    """Whether tensor parallelism splits the K/V heads (t divides them) or replicates them."""
    return model.kv_heads % tp == 0


def tensor_numel(model: ModelSpec, name: str, numel: int, tp: int) -> int:
    """Elements of parameter `name` (`numel` in all) on one tensor-parallel rank."""
    module = name.rsplit(".", 2)[-2]
    if module in VOCAB:
        return three_d_theory.padded_vocab(model.vocab, tp) * model.hidden // tp
    if module in SPLIT or (module in KV and kv_split(model, tp)):
        return numel // tp
    return numel


def stage_params(model: ModelSpec, layout: Layout, stage: int = 0) -> tuple[int, int]:
    """(parameters, trainable ones) of a tensor-parallel rank of pipeline stage `stage`: its
    blocks, the embedding on the first stage, the final norm and the head on the last."""
    blocks = set(three_d_theory.stage_layers(model.layers, layout.pp)[stage])
    first, last = stage == 0, stage == layout.pp - 1
    params = trainable = 0
    for name, p in model.meta_model().named_parameters():
        parts = name.split(".")
        if parts[:2] == ["model", "layers"]:
            mine = int(parts[2]) in blocks
        else:
            mine = first if "embed_tokens" in name else last
        if mine:
            n = tensor_numel(model, name, p.numel(), layout.tp)
            params += n
            trainable += n if p.requires_grad else 0
    return params, trainable


def layer_flops(model: ModelSpec, batch: int, seq: int) -> float:
    """Forward and backward FLOPs of one layer for `batch` sequences (3x the forward):
    2·b·s per weight element (Q and O: h² each, K and V: h·kv_heads·h/heads each, the SwiGLU's
    three h·ffn) plus the scores and their weighted sum, 4·b·s²·h."""
    h = model.hidden
    kv = model.kv_heads * (h // model.heads)
    weights = 2 * h * h + 2 * h * kv + 3 * h * model.ffn
    return 3 * (2 * batch * seq * weights + 4 * batch * seq**2 * h)


def norm_bytes(tokens: int, hidden: int, element_bytes: int) -> int:
    """What an RMSNorm computed in float32 saves: its input in float32, 1/rms per token
    (float32), and the normalised input in the compute type (the weight's multiplicand)."""
    return 4 * tokens * hidden + 4 * tokens + element_bytes * tokens * hidden


def layer_bytes(model: ModelSpec, layout: Layout) -> float:
    """What one layer saves for backward per micro-batch on a tensor-parallel rank:
    - replicated on every tp rank: the two RMSNorms (`norm_bytes`), their outputs (the
      inputs of the column-parallel projections), and rotary's cos and sin for Q and for K
      (4·s·d elements, the same for every sequence);
    - split t ways: Q after rotary, K and V repeated to every head, the attention output
      (4·b·s·h) and its float32 log-sum-exp (b·a·s), and the SwiGLU's gate, silu(gate), up
      and their product (4·b·s·ffn)."""
    b, s, h, a = layout.micro_batch, model.seq, model.hidden, model.heads
    t, e, tokens = layout.tp, layout.element_bytes, layout.micro_batch * model.seq
    d = h // a
    replicated = 2 * norm_bytes(tokens, h, e) + 2 * e * tokens * h + 4 * s * d * e
    split = e * (4 * tokens * h + 4 * tokens * model.ffn) + 4 * b * a * s
    return replicated + split / t


def head_bytes(batch: int, model: ModelSpec, layout: Layout, mean_bytes: int) -> int:
    """The final RMSNorm, the head's input, the log-softmax over the vocabulary (1/t of the
    padded vocabulary), the int64 targets and the mean's scalar (`mean_bytes`)."""
    tokens, e, t = batch * model.seq, layout.element_bytes, layout.tp
    vocab = three_d_theory.padded_vocab(model.vocab, t) // t
    logits = e * tokens * (model.hidden + vocab)
    return norm_bytes(tokens, model.hidden, e) + logits + 8 * tokens + mean_bytes
