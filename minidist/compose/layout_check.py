"""What `parallelize` can compose, checked before any rank starts: the sizes of a course model
or a transformers model (`model_sizes`) and the one-line refusals of the layouts it cannot
take (`check_layout`, `check_course_layout`), each naming the model's feature and the
layout.

Not composed (refused with the reason): an MoE that drops tokens (its result would depend
on the routing groups, so on the layout: lesson 16 shows each group equal).
"""

from __future__ import annotations

import torch.nn as nn

from ..expert_parallel.gpt import MoEMLP
from ..model_parts import family, find_parts, hf_sizes, is_hf, takes_positions
from .dims import ParallelDims
from .experts import expert_modules
from .tensor_parallel import routed_expert


def model_sizes(model: nn.Module) -> dict:
    """heads, head_dim, kv_heads, layers, seq_len, hidden, rope_theta, experts: ours or HF's
    names."""
    if is_hf(model):
        return {**hf_sizes(model.config), "moes": [], "rope_theta": None, "seq_len": None}
    cfg = model.cfg if hasattr(model, "cfg") else model.config
    get = lambda *names: next(getattr(cfg, n) for n in names if hasattr(cfg, n))  # noqa: E731
    heads, hidden = get("heads", "num_attention_heads"), get("hidden", "hidden_size")
    moes = [m.moe for m in model.modules() if isinstance(m, MoEMLP)]
    return dict(
        heads=heads,
        head_dim=hidden // heads,
        kv_heads=get("kv_heads", "num_key_value_heads", "heads"),
        layers=get("layers", "num_hidden_layers"),
        seq_len=get("seq_len", "max_position_embeddings"),
        hidden=hidden,
        rope_theta=get("rope_theta") if family(model) == "llama" else None,
        experts=moes[0].num_experts if moes else 0,
        moes=moes,
    )


def check_layout(model: nn.Module, dims: ParallelDims, seq_len: int) -> dict:
    """Refuse, in one line naming the model's feature and the layout, what `parallelize`
    cannot compose for a transformers `model` (call it in the parent, before any rank
    starts); its sizes otherwise."""
    sizes = {**hf_sizes(model.config), "seq_len": seq_len}
    dims.check_model(sizes["heads"], sizes["layers"], seq_len, sizes["experts"])
    find_parts(model)
    if dims.tp > 1:
        for name, module in model.named_modules():
            children = dict(module.named_children())
            latent = {"q_b_proj", "kv_b_proj"} <= set(children) or {"q_proj", "kv_b_proj"} <= set(
                children
            )  # latent attention: split by heads after its latents (`tensor_parallel`)
            if "o_proj" in children and not {"q_proj", "qkv_proj"} & set(children) and not latent:
                raise ValueError(
                    f"parallelize: tp={dims.tp}: {name} projects its queries through "
                    f"{sorted(n for n in children if 'proj' in n)}, which tp does not split "
                    "here; use tp = 1 for this model"
                )
            parent = model.get_submodule(name.rpartition(".")[0])
            if isinstance(module, nn.Linear) and routed_expert(name, parent):
                raise ValueError(
                    f"parallelize: experts with tp={dims.tp} are not composed "
                    f"here ({name}; use ep, or tp = 1)"
                )
    if dims.tp > 1 and sizes["kv_heads"] != sizes["heads"]:
        fused = [n for n, _ in model.named_modules() if n.endswith(".qkv_proj")]
        if fused:
            raise ValueError(
                f"parallelize: tp={dims.tp}: {fused[0]} fuses Q, K, V with "
                f"{sizes['kv_heads']} KV heads for {sizes['heads']} query heads (sections of "
                "unequal size are not split here); use tp = 1 for this model"
            )
    if dims.ep > 1:
        expert_modules(model, sizes["experts"])
    dropout = getattr(model.config, "attention_dropout", 0.0)
    if dims.cp > 1 and dropout:
        raise ValueError(
            f"parallelize: cp={dims.cp} with attention_dropout={dropout}: ring "
            "attention has no dropout"
        )
    return sizes


def check_course_layout(model: nn.Module, dims: ParallelDims) -> None:
    """Refuse, in one line, what `parallelize` cannot compose for one of the course's models
    (call it in the parent, on the model or its copy on the meta device)."""
    sizes = model_sizes(model)
    dims.check_model(sizes["heads"], sizes["layers"], sizes["seq_len"], sizes["experts"])
    if dims.cp > 1 and not takes_positions(model):
        raise ValueError(
            f"parallelize: cp={dims.cp} needs {type(model).__name__}.forward to take "
            "position_ids (a rank's tokens sit at their global positions)"
        )
    for moe in sizes["moes"]:
        if moe.capacity_factor * moe.k < moe.num_experts:
            raise ValueError(
                f"parallelize: capacity_factor={moe.capacity_factor} drops tokens (need "
                f"≥ experts/k = {moe.num_experts / moe.k}): which ones depends on the "
                "routing groups, so on the layout"
            )
