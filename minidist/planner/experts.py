"""The planner's expert-parallel terms (lesson 16's MoE GPT, `Layout(ep=e)`): what rank 0
holds, sends and computes, from `expert_parallel.theory` and the meta model's parameters.

Rank 0 holds every replicated parameter (attention, norms, embeddings, the routers) and
experts 0 .. E/e-1 of each layer. Bytes per step are those of `ExpertParallelGPT` padded to
capacity (GShard's static shapes, Lepikhin et al. 2020, section 3.2), so they need no
routing: C = ⌈cf · T · k / E⌉ rows per expert and source rank, T = the rank's b·s tokens.
Its activations are an upper bound: how many assignments a rank keeps depends on the
routing, so every slot its tokens can fill is counted filled.
"""

from __future__ import annotations

from ..data_parallel import theory as dp_theory
from ..expert_parallel import theory as ep_theory
from ..expert_parallel.gpt import is_expert
from .spec import Layout, ModelSpec


def rank_tensors(model: ModelSpec, layout: Layout) -> list:
    """Rank 0's parameters on the meta model: the replicated ones and its E/e experts."""
    per = model.experts // layout.ep
    out = []
    for name, p in model.meta_model().named_parameters():
        if is_expert(name) and int(name.split(".experts.")[1].split(".")[0]) >= per:
            continue
        out.append(p)
    return out


def rank_params(model: ModelSpec, layout: Layout) -> tuple[int, int, int]:
    """(parameters, trainable ones, trainable tensors) rank 0 holds."""
    mine = rank_tensors(model, layout)
    trainable = [p for p in mine if p.requires_grad]
    return sum(p.numel() for p in mine), sum(p.numel() for p in trainable), len(trainable)


def tokens_and_capacity(model: ModelSpec, layout: Layout) -> tuple[int, int]:
    """(T, C): the tokens rank 0 routes per MoE layer and step, and each expert's capacity."""
    tokens = layout.global_batch // layout.dp * model.seq
    return tokens, ep_theory.capacity(tokens, model.experts, model.top_k, model.capacity_factor)


def traffic(model: ModelSpec, layout: Layout) -> dict[tuple[str, str], float]:
    """{(collective, group): bytes} per step: the layers' padded all-to-alls on the ep group
    (`expert_parallel.theory.padded_all_to_all_bytes`), the replicated gradients' all-reduce
    over dp and the experts' over the dp/ep ranks holding them ("edp"); their sum is
    `expert_parallel.theory.padded_bytes_sent_per_step`."""
    _, cap = tokens_and_capacity(model, layout)
    e, r = layout.ep, layout.reduce_bytes
    a2a = ep_theory.padded_all_to_all_bytes(
        model.experts, e, cap, model.hidden, layout.element_bytes
    )
    experts = model.expert_numel()
    replicated = model.trainable - experts
    out = {
        ("all_to_all", "ep"): model.layers * sum(a2a.values()),
        ("all_reduce", "dp"): dp_theory.bytes_sent_per_step(replicated, layout.dp, r),
        ("all_reduce", "edp"): dp_theory.bytes_sent_per_step(experts // e, layout.dp // e, r),
    }
    return {k: v for k, v in out.items() if v}


def layer_flops(model: ModelSpec, layout: Layout) -> float:
    """FLOPs of one MoE block on rank 0 per step: the dense block's
    (`megatron.theory.transformer_layer_flops`) less its MLP's 3 · 16·T·h², plus the
    router's 3 · 2·T·h·E and the rank's experts on their padded rows
    (`expert_parallel.theory.expert_flops`)."""
    from ..megatron import theory as tp_theory

    tokens, cap = tokens_and_capacity(model, layout)
    b, s, h, n = layout.global_batch // layout.dp, model.seq, model.hidden, model.experts
    dense = tp_theory.transformer_layer_flops(b, s, h) - 3 * 16 * tokens * h**2
    router = 3 * 2 * tokens * h * n
    return dense + router + ep_theory.expert_flops(n, layout.ep, cap, h, 4 * h)


def calls(model: ModelSpec, layout: Layout) -> dict[str, int]:
    """Calls per step: 4 all-to-alls per layer (dispatch, combine and their gradients) on ep;
    one flat all-reduce of the replicated gradients, one of the experts' when dp/ep > 1."""
    ep = 4 * model.layers if layout.ep > 1 else 0
    dp = (layout.dp > 1) + (layout.dp // layout.ep > 1)
    return {"ep": ep, "dp": dp}


def max_kept(model: ModelSpec, layout: Layout) -> int:
    """The most assignments rank 0 can keep per MoE layer: min(T·k, E·C)."""
    tokens, cap = tokens_and_capacity(model, layout)
    return min(tokens * model.top_k, model.experts * cap)


def layer_bytes(model: ModelSpec, layout: Layout, kept: int | None = None) -> float:
    """What one MoE block saves for backward on rank 0: the dense block's
    (`megatron.theory.activation_bytes_per_layer`) less its MLP's two 4h activations, plus
    the MoE layer's (`expert_parallel.theory.padded_saved_bytes`) less its router's input,
    which is the second layer norm's output the dense block already counts. `kept`
    assignments (default `max_kept`, which makes it an upper bound for any routing)."""
    from ..megatron import theory as tp_theory

    tokens, cap = tokens_and_capacity(model, layout)
    b, s, h, e = layout.micro_batch, model.seq, model.hidden, layout.element_bytes
    dense = tp_theory.activation_bytes_per_layer(b, s, h, model.heads, 1, e)
    kept = max_kept(model, layout) if kept is None else kept
    moe = ep_theory.padded_saved_bytes(
        tokens, h, model.experts, model.top_k, layout.ep, cap, kept, e
    )
    return dense - e * 8 * tokens * h + moe - e * tokens * h
