"""Memory and bytes of one rank for a (model, layout), from the lessons' own theory functions.

Nothing here restates a formula: each term calls the lesson that teaches it (ZeRO's
sharded model states, FSDP's units, mixed precision's (2 + 2 + 12)Ψ, offload's tiers,
Megatron's split parameters and all-reduces, the pipeline's bubble and p2p bytes, 3D's
composition, Korthikanti et al.'s activations, sequence parallelism's reduce-scatters and
all-gathers, context parallelism's ring). This module chooses which, and fills in the
arguments from the `ModelSpec` and the `Layout`.

The rank described is rank 0: the first pipeline stage (which holds the most 1F1B
activations, and the token embedding; with ZB-V and DualPipeV also the last virtual stage,
the head), first tp and dp rank. The course's own choices are
the defaults, so a course run and its plan agree to the byte: SGD with momentum for tensor
and pipeline parallelism, Adam for ZeRO and FSDP, float32 unless `precision="mixed"`.
"""

from __future__ import annotations

from .. import comm
from ..context_parallel import theory as cp_theory
from ..data_parallel import theory as dp_theory
from ..data_parallel.buckets import MiB, plan_buckets
from ..fsdp import theory as fsdp_theory
from ..megatron import theory as tp_theory
from ..mixed_precision import theory as mp_theory
from ..offload import theory as offload_theory
from ..pipeline import theory as pp_theory
from ..pipeline.schedules import schedule
from ..pipeline.simulate import simulate
from ..sequence_parallel import theory as sp_theory
from ..three_d import theory as three_d_theory
from ..zero import theory as zero_theory
from . import experts, llama
from .activations import holds_head, stage_layers, virtual_stages
from .spec import Layout, ModelSpec

KINDS = ("params", "grads", "optimizer", "activations")  # the keys of `Plan.memory`


def shard_group(layout: Layout) -> int:
    """Ranks one FSDP/ZeRO shard spans: the hybrid group, else all of dp."""
    return layout.shard_size or layout.dp


def zero_buckets(model: ModelSpec, layout: Layout) -> list[int]:
    """Trainable elements of each flat bucket ZeRO-1/2 shards (`plan_buckets` on the meta
    model), or one bucket of Ψ for a spec that has only a parameter count."""
    if not model.has_config:
        return [model.trainable]
    params = [p for p in model.tensors() if p.requires_grad]
    cap = int(layout.bucket_cap_mb * MiB)
    return [sum(params[i].numel() for i in b) for b in plan_buckets(params, cap, cap)]


def owned_elements(model: ModelSpec, layout: Layout) -> int:
    """Trainable elements of FSDP's padded flat shards rank 0 owns and steps."""
    f = shard_group(layout)
    return sum(fsdp_theory.padded(u, f) // f for u in model.fsdp_units())


def _stage_params(model: ModelSpec, layout: Layout) -> tuple[int, int]:
    """(parameters, trainable ones) of a rank of stage 0 under tp × pp (lesson 10)."""
    if model.arch == "llama":
        return llama.stage_params(model, layout)
    cfg = (model.layers, model.hidden, model.vocab, model.seq, layout.tp)
    total, held = virtual_stages(layout)  # with chunks, each its own (a V: both tied copies)
    params = sum(three_d_theory.params_per_rank(k, total, *cfg) for k in held)
    frozen = model.frozen_numel if holds_head(layout) else 0  # ln_f lives on the last stage
    return params, params - frozen


def model_states(model: ModelSpec, layout: Layout) -> dict[str, float]:
    """{params, grads, optimizer}: bytes rank 0 keeps on its device between steps."""
    if model.experts:  # lesson 16's MoE GPT: the replicated parameters and E/ep experts
        return _unsharded(*experts.rank_params(model, layout), layout)
    n, z = layout.dp, layout.zero
    e = layout.element_bytes
    if layout.tp > 1 or layout.pp > 1:
        params, trainable = _stage_params(model, layout)
        if layout.precision == "mixed" or layout.optimizer == "adam":
            master = 4 if layout.precision == "mixed" else 0  # fp32: the parameters are masters
            return _mixed(trainable, n, z, e, params - trainable, 0, master)
        if z == 0:  # lesson 08: TP with DDP across, SGD + momentum
            total = dp_theory.model_state_bytes_per_rank(params, trainable, "sgd")
        else:  # lesson 10: ZeRO-1 over dp of the flat of this rank's trainable elements
            total = three_d_theory.model_state_bytes_per_rank(params, trainable, n)
        return {
            "params": 4 * params,
            "grads": 4 * trainable,
            "optimizer": total - 4 * (params + trainable),
        }
    frozen = model.frozen_numel
    if z == 0:
        tensors = sum(1 for p in model.tensors() if p.requires_grad) if model.has_config else 0
        return _unsharded(model.num_params, model.trainable, tensors, layout)
    f = shard_group(layout)
    if z in (1, 2):
        buckets = zero_buckets(model, layout)
        padded = zero_theory.padded_numel(buckets, n)
        if layout.precision == "fp32":
            return zero_theory.fp32_adam_rank_bytes(padded, n, z, frozen, adam_steps=len(buckets))
        return _mixed(padded, n, z, e, frozen, len(buckets))
    units = model.fsdp_units()
    if layout.offload != "device":
        owned = owned_elements(model, layout)
        device = offload_theory.tier_bytes(owned, layout.offload, len(units), frozen, e, e)
        return dict(device["device"])
    if layout.precision == "fp32":
        out = dict(fsdp_theory.sharded_state_bytes(units, f))
        out["params"] += 4 * frozen
        return out
    padded = sum(fsdp_theory.padded(u, f) for u in units)
    return _mixed(padded, f, 3, e, frozen, len(units))


def _unsharded(params: int, trainable: int, tensors: int, layout: Layout) -> dict[str, float]:
    """{params, grads, optimizer} of a rank holding `params` elements whole (`trainable` of
    them in `tensors` stepped tensors), nothing sharded: DDP (lesson 01's
    `model_state_bytes_per_rank`), or mixed precision's terms at stage 0."""
    if layout.precision == "mixed":
        return _mixed(trainable, 1, 0, layout.element_bytes, params - trainable, tensors)
    total = dp_theory.model_state_bytes_per_rank(params, trainable, layout.optimizer, tensors)
    held, grads = 4 * params, 4 * trainable
    return {"params": held, "grads": grads, "optimizer": total - held - grads}


def _mixed(
    padded: int, n: int, stage: int, e: int, frozen: int, steps: int, master: int = 4
) -> dict:
    """Mixed-precision Adam's four terms (`mixed_precision.theory.model_state_terms`) on
    `padded` trainable elements, plus the frozen ones (compute dtype) and one 4-byte step
    counter per stepped tensor, folded into params, grads and optimizer (master + moments)."""
    terms = mp_theory.model_state_terms(padded, n, stage, compute_bytes=e, master_bytes=master)
    return {
        "params": terms["params"] + e * frozen,
        "grads": terms["grads"],
        "optimizer": terms["master"] + terms["moments"] + 4 * steps,
    }


def traffic(model: ModelSpec, layout: Layout) -> dict[tuple[str, str], float]:
    """{(collective, group): bytes} rank 0 sends per step on a ring (`comm.ring_bytes`)."""
    n, z, e, r = layout.dp, layout.zero, layout.element_bytes, layout.reduce_bytes
    if model.experts:
        return experts.traffic(model, layout)
    if layout.cp > 1:
        return context_parallel_traffic(model, layout)
    if layout.tp > 1 or layout.pp > 1:
        by_kind = _three_d_bytes(model, layout)
        scale = e / 4  # the lessons count float32; every term is linear in the element size
        tp = scale * by_kind["tp"] + recompute_tp_bytes(model, layout)
        out = {("all_reduce", "tp"): tp, ("p2p", "pp"): scale * by_kind["pp"]}
        if layout.sp:
            del out[("all_reduce", "tp")]
            out.update(sequence_parallel_tp_traffic(model, layout))
        if z == 0:
            _, trainable = _stage_params(model, layout)
            out[("all_reduce", "dp")] = dp_theory.bytes_sent_per_step(trainable, n, r)
        else:  # reduce-scatter of gradients + all-gather of parameters, equal halves
            out[("reduce_scatter+all_gather", "dp")] = (r + e) / 8 * by_kind["dp"]
        return out
    if z == 0:
        return {("all_reduce", "dp"): dp_theory.bytes_sent_per_step(model.trainable, n, r)}
    if z in (1, 2):
        padded = zero_theory.padded_numel(zero_buckets(model, layout), n)
        return {
            ("reduce_scatter", "dp"): comm.ring_bytes("reduce_scatter", padded * r, n),
            ("all_gather", "dp"): comm.ring_bytes("all_gather", padded * e, n),
        }
    units = model.fsdp_units()
    f = shard_group(layout)
    # a spec without configuration is one unit that is not a root: gathered again in backward
    root = model.has_config
    gathers = fsdp_theory.bytes_sent_per_step(units, n, True, f, e, has_root=root)
    reduces = fsdp_theory.bytes_sent_per_step(units, n, True, f, r, has_root=root)
    out = {
        ("all_gather", "shard"): gathers["all_gather"],
        ("reduce_scatter", "shard"): reduces["reduce_scatter"],
    }
    if "all_reduce" in reduces:
        out[("all_reduce", "replicate")] = reduces["all_reduce"]
    return out


def _three_d_bytes(model: ModelSpec, layout: Layout) -> dict[str, float]:
    """Lesson 10's {tp, pp, dp} bytes of rank 0 in float32; the Llama's pipeline has no tied
    embedding to reduce, and its ZeRO-1 flat is its own stage's trainable elements."""
    total, held = virtual_stages(layout)
    if model.arch != "llama" and len(held) > 1:  # every chunk sends as its virtual stage
        # would (outputs on, input gradients back); the tied copies meet over the embedding
        # group unless both are here (a V), summed without a message
        b, s, h, t = layout.global_batch // layout.dp, model.seq, model.hidden, layout.tp
        tied = three_d_theory.pp_bytes_sent_per_step(0, 2, 0, s, h, model.vocab, t)  # b = 0
        sent = sum(pp_theory.p2p_bytes_sent_per_step(k, total, b, s, h, 0) for k in held)
        return {
            "tp": three_d_theory.tp_bytes_sent_per_step(0, layout.pp, model.layers, b, s, h, t),
            "pp": sent + (0 if holds_head(layout) else tied),
            "dp": three_d_theory.dp_bytes_sent_per_step(_stage_params(model, layout)[1], layout.dp),
        }
    if model.arch != "llama":
        cfg = model.layers, layout.global_batch, model.seq, model.hidden, model.vocab
        return three_d_theory.bytes_sent_per_step(
            0, layout.pp, *cfg, layout.tp, layout.dp, model.frozen_numel
        )
    b, s, h = layout.global_batch // layout.dp, model.seq, model.hidden
    return {
        "tp": three_d_theory.tp_bytes_sent_per_step(0, layout.pp, model.layers, b, s, h, layout.tp),
        "pp": pp_theory.p2p_bytes_sent_per_step(0, layout.pp, b, s, h, 0),
        "dp": three_d_theory.dp_bytes_sent_per_step(_stage_params(model, layout)[1], layout.dp),
    }


def sequence_parallel_tp_traffic(model: ModelSpec, layout: Layout) -> dict:
    """The tp group's bytes per step with sequence parallelism (lesson 14, pp = 1): each
    all-reduce becomes a reduce-scatter and an all-gather, and backward re-gathers the
    stored blocks (`sequence_parallel.theory.bytes_sent_per_step`, the cross entropy's three
    small all-reduces included; linear in the element size), plus the all-reduce of the
    gradients of the parameters every tp rank holds whole (`megatron.theory.
    replicated_params` less the frozen ones): under sp each rank's covers only its block.
    Recomputation repeats the forward's reduce-scatters and all-gathers: the bytes of the
    all-reduces they replace (`recompute_tp_bytes`)."""
    b = layout.global_batch // layout.dp
    s, h, t = model.seq, model.hidden, layout.tp
    acts = sp_theory.bytes_sent_per_step(model.layers, b, s, h, t) * layout.element_bytes / 4
    replicated = tp_theory.replicated_params(model.layers, h, s) - model.frozen_numel
    return {
        ("reduce_scatter+all_gather", "tp"): acts + recompute_tp_bytes(model, layout),
        ("all_reduce", "tp"): dp_theory.bytes_sent_per_step(replicated, t, layout.reduce_bytes),
    }


def context_parallel_traffic(model: ModelSpec, layout: Layout) -> dict:
    """Bytes per step with context parallelism (lesson 15) and DDP across: the ring's K and V
    blocks and their gradients per layer (`context_parallel.theory.ring_bytes_per_layer`,
    the replica's b sequences), the loss value's all-reduce over the c ranks
    (`context_parallel.theory.bytes_sent_per_step` with no layers and no gradients), and
    the gradients' all-reduce over the d·c ranks that hold the whole model (Megatron-LM's
    data × context group; `data_parallel.theory.bytes_sent_per_step`)."""
    b = layout.global_batch // layout.dp
    s, h, c, e = model.seq, model.hidden, layout.cp, layout.element_bytes
    ring = sum(cp_theory.ring_bytes_per_layer(b, s, h, c, e).values())
    d_c = layout.dp * c
    return {
        ("p2p", "cp"): model.layers * ring,
        ("all_reduce", "cp"): cp_theory.bytes_sent_per_step(0, b, s, h, c, 0),
        ("all_reduce", "dp-cp"): dp_theory.bytes_sent_per_step(
            model.trainable, d_c, layout.reduce_bytes
        ),
    }


def recompute_tp_bytes(model: ModelSpec, layout: Layout) -> float:
    """Bytes full recomputation adds on the tp group per step: each recomputed block runs its
    forward again in backward, and with it the forward's two g all-reduces (after attention,
    after the MLP; Shoeybi et al. 2019, section 3) of b·s·h elements: 6 all-reduces per
    layer and micro-batch instead of 4 (the one more forward of Chen et al. 2016, section
    4). The embedding, head and loss are not recomputed."""
    if not (layout.recompute and layout.tp > 1 and model.has_config):
        return 0.0
    b = layout.global_batch // layout.dp  # the replica's sequences, all micro-batches
    size = layout.element_bytes * b * model.seq * model.hidden
    return 2 * stage_layers(model, layout) * comm.ring_bytes("all_reduce", size, layout.tp)


def bus_traffic(model: ModelSpec, layout: Layout) -> dict[str, float]:
    """Bytes between device and host (and disk) per step when the optimizer is offloaded
    (lesson 05: every owned gradient down, every updated parameter up)."""
    if layout.offload == "device":
        return {}
    owned, e = owned_elements(model, layout), layout.element_bytes
    out = dict(offload_theory.bytes_moved_per_step(owned, e, e))
    if layout.offload == "disk":
        out.update(offload_theory.disk_bytes_per_step(owned))
    return out


def bubble(layout: Layout) -> float:
    """The pipeline's idle share (`pipeline.theory.bubble_fraction`, DualPipeV's from lesson
    09's simulator); 0 without a pipeline."""
    if layout.pp == 1:
        return 0.0
    kind = layout.schedule
    if kind == "dualpipev":  # no closed form: lesson 09's simulator, F = B = W = 1 per chunk
        steps = schedule(kind, layout.pp, layout.microbatches)
        return simulate(steps, 1.0, 1.0, 1.0, placement="v").bubble
    return pp_theory.bubble_fraction(layout.pp, layout.microbatches, kind, layout.virtual)


def flops_per_step(model: ModelSpec, layout: Layout) -> float:
    """FLOPs rank 0 computes per step: its stage's layers for its replica's sequences, split
    t ways (`megatron.theory.transformer_layer_flops`, 3x the forward; 4x with
    recomputation, which runs the forward twice), plus the output head's 6·b·s·h·V/t on
    the stage that has it (all of them when pp = 1); over c with context parallelism (the
    zig-zag split gives every rank 1/c of the causal work, `context_parallel.theory.
    causal_work`); MoE blocks as `experts.layer_flops` counts them."""
    if not model.has_config:
        return 0.0
    b = layout.global_batch // layout.dp
    s, h = model.seq, model.hidden
    layer = tp_theory.transformer_layer_flops(b, s, h)
    if model.arch == "llama":
        layer = llama.layer_flops(model, b, s)
    if model.experts:
        layer = experts.layer_flops(model, layout)
    if layout.recompute:
        layer *= 4 / 3
    head = 6 * b * s * h * model.vocab if holds_head(layout) else 0.0
    return (stage_layers(model, layout) * layer + head) / (layout.tp * layout.cp)
