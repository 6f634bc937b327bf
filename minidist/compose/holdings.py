"""What a rank holds under a composed layout (lesson 17): its pipeline chunks and, in them, the
tensor-parallel share of each parameter, from lesson 07's plans (`megatron.plan`: the GPT's
and the Llama's, naming the splits `compose.tensor_parallel` applies by module name; the
tests hold the two equal, to the byte). Shared by `compose.theory` (model states, dp/pp/cp
bytes) and `compose.tensor_bytes` (the tp group's bytes)."""

from __future__ import annotations

from fnmatch import fnmatchcase

import torch.nn as nn

from ..pipeline.schedules import virtual_stage
from ..three_d.theory import stage_layers

SPLIT = ("colwise", "colwise_qkv", "rowwise", "vocab")


def chunks(dims, pp_rank: int, layers: int) -> list[tuple[int, range, bool, bool]]:
    """(virtual stage, its layers, first, last) of each chunk of pipeline rank `pp_rank`."""
    stages = dims.pp * dims.chunks
    out = []
    for c in range(dims.chunks):
        vs = virtual_stage(dims.schedule, pp_rank, c, dims.pp)
        out.append((vs, stage_layers(layers, stages)[vs], vs == 0, vs == stages - 1))
    return out


def _style(plan: dict, module: str) -> str | None:
    return next((s for p, s in plan.items() if fnmatchcase(module, p)), None)


def local_numel(model: nn.Module, name: str, numel: int, tp: int, plan: dict) -> int:
    """Elements of parameter `name` on one tensor-parallel rank."""
    module, _, kind = name.rpartition(".")
    style = _style(plan, module)
    if style == "colwise_kv":
        sub = model.get_submodule(module)
        head_dim = (
            model.get_submodule(module.rpartition(".")[0]).q_proj.out_features
            // (_sizes(model)["heads"])
        )
        split = (sub.out_features // head_dim) % tp == 0
        return numel // tp if split else numel
    if style == "vocab" or module == "lm_head":  # the vocabulary's rows, padded to t's multiple
        hidden = _sizes(model)["hidden"]  # [V, hidden] both
        return -(-(numel // hidden) // tp) * hidden
    if style in SPLIT and not (style == "rowwise" and kind == "bias"):
        return numel // tp
    return numel


def _sizes(model: nn.Module) -> dict:
    from .layout_check import model_sizes

    return model_sizes(model)


def _kv_split(model: nn.Module, module: str, tp: int) -> bool:
    """Whether tensor parallelism splits this K or V projection (t divides its heads)."""
    head_dim = (
        model.get_submodule(module.rpartition(".")[0]).q_proj.out_features
        // (_sizes(model)["heads"])
    )
    return (model.get_submodule(module).out_features // head_dim) % tp == 0


def _split(model: nn.Module, plan: dict, name: str, tp: int) -> bool:
    """Whether parameter `name` is cut t ways (else every tp rank holds it whole)."""
    module, _, kind = name.rpartition(".")
    style = _style(plan, module)
    if style == "colwise_kv":
        return _kv_split(model, module, tp)
    return style in SPLIT and not (style == "rowwise" and kind == "bias")


def _owner(kind: str, name: str, first: bool, last: bool, layers: range) -> bool:
    parts = name.split(".")
    if kind == "gpt":
        if parts[0] == "blocks":
            return int(parts[1]) in layers
        return first if parts[0] in ("tok_emb", "pos_emb") else last
    if parts[:2] == ["model", "layers"]:
        return int(parts[2]) in layers
    return first if parts[1:2] == ["embed_tokens"] else last
