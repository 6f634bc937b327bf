"""Tensor parallelism from a plan: module-name patterns mapped to how each module splits.

The same idea as torch's `torch.distributed.tensor.parallel.parallelize_module(module, mesh,
plan)` (a plan like `{"layers.*.attention.wq": ColwiseParallel(), ...}`, the way torchtitan
writes Llama's): the model's own code stays as it is; the plan names the Linear and
Embedding modules to replace with lesson 07's layers, built from them so they start equal:

- `colwise`: `ColumnParallelLinear` (output rows split; f before it);
- `colwise_qkv`: the same over a fused Q, K, V weight, split per section (3 blocks);
- `colwise_kv`: K or V of grouped-query attention (Ainslie et al. 2023): split by heads
  when tp divides the KV heads; otherwise **replicated**: every tp rank keeps the whole
  projection, uses the heads its query heads need, and its weight gradient (each rank's
  covers only its query heads) is summed over the tp group (`tp_partial`);
- `rowwise`: `RowParallelLinear` (input columns split; g after it);
- `vocab`: `VocabParallelEmbedding` (rows of the vocabulary split; g after the lookup), or
  for an output head's Linear `VocabParallelHead` (its logits' columns; f before it);
- `sequence`: a module between the regions (norms): replicated, and under sequence
  parallelism (lesson 14) it runs on this rank's block of the sequence, so its parameters'
  gradients are partial sums, reduced over tp (`allreduce_replicated_grad`).

`apply_plan(root, plan, group, sequence_parallel)` replaces the matched modules in place and
returns the names it matched per style; a pattern that matches nothing is an error (a plan
written for other names would otherwise silently leave the model whole).
"""

from __future__ import annotations

from fnmatch import fnmatchcase

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from .layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    VocabParallelHead,
)
from .ops import copy_to_tp
from .sequence import allreduce_replicated_grad, gather_from_sequence

STYLES = ("colwise", "colwise_qkv", "colwise_kv", "rowwise", "vocab", "sequence")

GPT_PLAN = {
    "tok_emb": "vocab",
    "blocks.*.attn.qkv": "colwise_qkv",
    "blocks.*.attn.proj": "rowwise",
    "blocks.*.mlp.0": "colwise",
    "blocks.*.mlp.2": "rowwise",
    "blocks.*.ln[12]": "sequence",
    "ln_f": "sequence",
    "lm_head": "vocab",  # tied to tok_emb's slice (a pipeline's last stage: its own copy)
}
LLAMA_PLAN = {  # Hugging Face's LlamaForCausalLM names
    "model.embed_tokens": "vocab",
    "model.layers.*.self_attn.q_proj": "colwise",
    "model.layers.*.self_attn.[kv]_proj": "colwise_kv",
    "model.layers.*.self_attn.o_proj": "rowwise",
    "model.layers.*.mlp.gate_proj": "colwise",
    "model.layers.*.mlp.up_proj": "colwise",
    "model.layers.*.mlp.down_proj": "rowwise",
    "model.layers.*.*_layernorm": "sequence",
    "model.norm": "sequence",
    "lm_head": "colwise",
}


class ReplicatedLinear(nn.Module):
    """A Linear every tp rank holds whole inside a region (K or V when tp does not divide
    the KV heads): its input enters the region (f, or the sequence all-gather), and its
    gradient is summed over tp (`tp_partial`)."""

    sequence_parallel = False
    entered = False  # the input entered the region once, before the module's projections

    def __init__(self, dense: nn.Linear, group):
        super().__init__()
        self.group = group
        self.weight = nn.Parameter(dense.weight.detach().clone())
        self.bias = None if dense.bias is None else nn.Parameter(dense.bias.detach().clone())
        for p in self.parameters():
            p.tp_partial = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.entered:
            enter = gather_from_sequence if self.sequence_parallel else copy_to_tp
            x = enter(x, self.group)
        return F.linear(x, self.weight, self.bias)


def _build(style: str, module: nn.Module, parent: nn.Module, group, name: str) -> nn.Module:
    n = dist.get_world_size(group)
    if style == "vocab":
        if isinstance(module, nn.Linear):  # an output head: its own slice (tie it after)
            return VocabParallelHead(module, group)
        if not isinstance(module, nn.Embedding):
            raise ValueError(
                f"apply_plan: {name} is {type(module).__name__}; 'vocab' needs an nn.Embedding "
                "or an output head's nn.Linear"
            )
        return VocabParallelEmbedding(module, group)
    if not isinstance(module, nn.Linear):
        raise ValueError(
            f"apply_plan: {name} is {type(module).__name__}; {style!r} needs an nn.Linear"
        )
    if style == "rowwise":
        return RowParallelLinear(module, group)
    if style == "colwise_qkv":
        return ColumnParallelLinear(module, group, blocks=3)
    if style == "colwise_kv":
        heads = module.out_features // parent.head_dim
        return (
            ColumnParallelLinear(module, group)
            if heads % n == 0
            else ReplicatedLinear(module, group)
        )
    return ColumnParallelLinear(module, group)


def apply_plan(
    root: nn.Module,
    plan: dict[str, str],
    group,
    sequence_parallel: bool = False,
    required: bool = True,
) -> dict[str, list[str]]:
    """Replace `root`'s modules matched by `plan` with their tensor-parallel form, in place.
    `required=False` lets a pattern match nothing (a pipeline stage holds some layers)."""
    for pattern, style in plan.items():
        if style not in STYLES:
            raise ValueError(f"apply_plan: plan[{pattern!r}] = {style!r} must be one of {STYLES}")
    matched: dict[str, list[str]] = {s: [] for s in STYLES}
    hit = dict.fromkeys(plan, False)
    for name, module in list(root.named_modules()):
        styles = [(p, s) for p, s in plan.items() if fnmatchcase(name, p)]
        if not styles:
            continue
        if len(styles) > 1:
            raise ValueError(f"apply_plan: {name} matches several patterns: {styles}")
        pattern, style = styles[0]
        hit[pattern] = True
        matched[style].append(name)
        if style == "sequence":
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = root.get_submodule(parent_name)
        setattr(parent, attr, _build(style, module, parent, group, name))
    missing = [p for p, h in hit.items() if not h]
    if required and missing:
        raise ValueError(f"apply_plan: patterns {missing} match no module of the model")
    replicated = [p for p in root.parameters() if not hasattr(p, "tp_split")]
    if sequence_parallel:
        for module in root.modules():
            if hasattr(type(module), "sequence_parallel"):
                module.sequence_parallel = True
    for p in replicated:  # partial sums over tp: sequence-parallel or replicated K/V
        if p.requires_grad and (sequence_parallel or getattr(p, "tp_partial", False)):
            p.register_hook(lambda g: allreduce_replicated_grad(g, group))
    return matched
