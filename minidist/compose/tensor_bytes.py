"""Lesson 17's plan of the tensor-parallel group's bytes: each module's collectives, from the
plan's styles (lessons 07 and 14), per micro-batch of each chunk (`compose.theory` holds the
other group kinds and the model states)."""

from __future__ import annotations

import torch.nn as nn

from ..expert_parallel.gpt import MoEMLP
from ..ledger import ring_bytes
from ..megatron.plan import GPT_PLAN, LLAMA_PLAN
from ..model_parts import family
from .holdings import _owner, _sizes, _split, _style, chunks


def tp_calls(model: nn.Module, dims, chunk_layers: range, first: bool, last: bool):
    """([(op, phase, elements per token, in a layer)], partial) for one micro-batch of one
    chunk on the tp group, from the plan's styles (lessons 07 and 14): the input a layer's
    column-parallel projections share (q, k, v; gate, up) enters their module once
    (`apply_tensor_parallel`), and so does the head's input (the final norm's output):
    all-reduced in backward (f) or, under sequence parallelism, all-gathered in forward and
    its gradient reduce-scattered (the gathered input is what the projections save, so
    nothing is gathered again); a row-parallel output is all-reduced in forward (g) or
    reduce-scattered (all-gathered in backward); the vocabulary-parallel embedding like a
    row output; the loss's three float32 all-reduces per token (max, sum of exponentials,
    target logit); under sp the course MoE's two all-gathers (it runs whole sequences).
    `partial`: elements of the gradients every tp rank holds a partial sum of (replicated
    K/V; under sp every parameter tensor parallelism does not cut, but the MoE's), (in the
    layers, outside them)."""
    kind, sizes = family(model), _sizes(model)
    plan = GPT_PLAN if kind == "gpt" else LLAMA_PLAN
    h, sp = sizes["hidden"], dims.sp
    enter = [("all_gather", "F"), ("reduce_scatter", "B")] if sp else [("all_reduce", "B")]
    row = [("reduce_scatter", "F"), ("all_gather", "B")] if sp else [("all_reduce", "F")]
    calls, entered, whole = [], set(), []
    for name, module in model.named_modules():
        if sp and isinstance(module, MoEMLP):
            if not _owner(kind, name + ".x", first, last, chunk_layers):
                continue
            # the MoE runs whole sequences (`experts.sequence_parallel_moe`): gathered in
            # forward, its output's gradient gathered in backward; its parameters not summed
            calls += [("all_gather", "F", h, True), ("all_gather", "B", h, True)]
            whole.append(name + ".")
            continue
        style = _style(plan, name)
        if style is None or not _owner(kind, name + ".x", first, last, chunk_layers):
            continue
        if name == "lm_head":  # the head's input (below)
            continue
        in_layer = name.split(".")[0] == "blocks" or name.startswith("model.layers.")
        if in_layer and style in ("colwise", "colwise_qkv", "colwise_kv"):
            region = name.rpartition(".")[0]  # the projections' module: one entry for all
            if region in entered:
                continue
            entered.add(region)
            ops, width = enter, module.in_features  # the gathered input is saved: no re-gather
        elif style == "rowwise":
            ops, width = row, module.out_features
        elif style == "vocab" and first:
            ops, width = row, h
        else:
            continue
        calls += [(op, phase, width, in_layer) for op, phase in ops]
    if last:
        # the final norm's output enters the head's region (`apply_tensor_parallel`): under sp
        # gathered once and saved whole by the head, so its backward re-gathers nothing (the
        # Llama's untied head re-gathered it, Korthikanti §4.2.2's extra all-gather, while
        # it was lesson 07's `vocab_head` with the sequence-parallel linear)
        calls += [(op, phase, h, False) for op, phase in enter]
        calls += [("all_reduce", "loss", 1, False)] * 3
    partial = [0, 0]
    for name, p in model.named_parameters():
        if not (p.requires_grad and _owner(kind, name, first, last, chunk_layers)):
            continue
        if any(name.startswith(w) for w in whole):
            continue
        module = name.rpartition(".")[0]
        if not _split(model, plan, name, dims.tp) and (sp or _style(plan, module) == "colwise_kv"):
            in_layer = name.startswith(("blocks.", "model.layers."))
            partial[0 if in_layer else 1] += p.numel()
    return calls, tuple(partial)


def tp_bytes(
    model: nn.Module,
    dims,
    micro_batch: int,
    microbatches: int,
    precision: str = "fp32",
    recompute: bool = False,
    pp_rank: int = 0,
    dp_shard_mode: str = "optim",
) -> float:
    """A rank's bytes on its tp group per step: `tp_calls` of each chunk, per micro-batch;
    recomputation repeats each layer's forward calls. The same under every schedule: a split
    backward (ZB-H1, ZB-V, DualPipeV) runs the backward calls in B, and W none (lesson 09's
    engine). The partial sums are all-reduced once per step (`sum_partial_gradients`); a
    layer's once per micro-batch where ZeRO-2/FSDP reduces its gradients after each."""
    if dims.tp == 1:
        return 0.0
    sizes = _sizes(model)
    e = 2 if precision == "bf16" else 4
    tokens = micro_batch * sizes["seq_len"] // dims.cp
    total = once = 0.0
    for _, layers, first, last in chunks(dims, pp_rank, sizes["layers"]):
        calls, (in_layers, outside) = tp_calls(model, dims, layers, first, last)
        for op, phase, width, in_layer in calls:
            size = 4 * tokens if phase == "loss" else e * tokens * width
            times = 2 if recompute and phase == "F" and in_layer else 1
            total += times * ring_bytes(op, size, dims.tp)
        if dp_shard_mode == "optim":
            once += ring_bytes("all_reduce", e * (in_layers + outside), dims.tp)
        else:  # each layer unit's before its reduce-scatter (in W); the root's at the end
            total += ring_bytes("all_reduce", e * in_layers, dims.tp)
            once += ring_bytes("all_reduce", e * outside, dims.tp)
    return microbatches * total + once
