"""Memory and bytes of one rank for a (model, layout), from the lessons' own theory functions.

Nothing here restates a formula: each term calls the lesson that teaches it (ZeRO's
sharded model states, FSDP's units, mixed precision's (2 + 2 + 12)Ψ, offload's tiers,
Megatron's split parameters and all-reduces, the pipeline's bubble and p2p bytes, 3D's
composition, Korthikanti et al.'s activations). This module chooses which, and fills in
the arguments from the `ModelSpec` and the `Layout`.

The rank described is rank 0: the first pipeline stage (which holds the most 1F1B
activations, and the token embedding), first tp and dp rank. The course's own choices are
the defaults, so a course run and its plan agree to the byte: SGD with momentum for tensor
and pipeline parallelism, Adam for ZeRO and FSDP, float32 unless `precision="mixed"`.
"""

from __future__ import annotations

from .. import comm
from ..data_parallel import theory as dp_theory
from ..data_parallel.buckets import MiB, plan_buckets
from ..fsdp import theory as fsdp_theory
from ..megatron import theory as tp_theory
from ..mixed_precision import theory as mp_theory
from ..offload import theory as offload_theory
from ..pipeline import theory as pp_theory
from ..pipeline.schedules import schedule
from ..recompute import theory as recompute_theory
from ..three_d import theory as three_d_theory
from ..zero import theory as zero_theory
from .spec import Layout, ModelSpec

KINDS = ("params", "grads", "optimizer", "activations")


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


def _stage_params(model: ModelSpec, layout: Layout) -> tuple[int, int]:
    """(parameters, trainable ones) of a rank of stage 0 under tp × pp (lesson 10)."""
    cfg = (model.layers, model.hidden, model.vocab, model.seq, layout.tp)
    params = three_d_theory.params_per_rank(0, layout.pp, *cfg)
    frozen = model.frozen_numel if layout.pp == 1 else 0  # ln_f lives on the last stage
    return params, params - frozen


def model_states(model: ModelSpec, layout: Layout) -> dict[str, float]:
    """{params, grads, optimizer}: bytes rank 0 keeps on its device between steps."""
    n, z = layout.dp, layout.zero
    e = layout.element_bytes
    if layout.tp > 1 or layout.pp > 1:
        params, trainable = _stage_params(model, layout)
        if layout.precision == "mixed" or layout.optimizer == "adam":
            terms = mp_theory.model_state_terms(trainable, n, z, compute_bytes=e)
            if layout.precision == "fp32":  # the masters are the parameters themselves
                terms["master"] = 0.0
            terms["params"] += e * (params - trainable)
            return _three(terms)
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
        if layout.precision == "mixed":
            terms = mp_theory.model_state_terms(model.trainable, 1, 0, compute_bytes=e)
            terms["params"] += e * frozen
            terms["moments"] += 4 * tensors
            return _three(terms)
        total = dp_theory.model_state_bytes_per_rank(
            model.num_params, model.trainable, layout.optimizer, tensors
        )
        params, grads = 4 * model.num_params, 4 * model.trainable
        return {"params": params, "grads": grads, "optimizer": total - params - grads}
    _need_adam(layout)
    f = shard_group(layout)
    if z in (1, 2):
        buckets = zero_buckets(model, layout)
        padded = zero_theory.padded_numel(buckets, n)
        if layout.precision == "fp32":
            return zero_theory.fp32_adam_rank_bytes(padded, n, z, frozen, adam_steps=len(buckets))
        terms = mp_theory.model_state_terms(padded, n, z, compute_bytes=e)
        terms["params"] += e * frozen
        terms["moments"] += 4 * len(buckets)
        return _three(terms)
    units = model.fsdp_units() if model.has_config else [model.trainable]
    owned = sum(fsdp_theory.padded(u, f) // f for u in units)
    if layout.offload != "device":
        device = offload_theory.tier_bytes(owned, layout.offload, len(units), frozen, e, e)
        return dict(device["device"])
    if layout.precision == "fp32":
        out = dict(fsdp_theory.sharded_state_bytes(units, f))
        out["params"] += 4 * frozen
        return out
    padded = sum(fsdp_theory.padded(u, f) for u in units)
    terms = mp_theory.model_state_terms(padded, f, 3, compute_bytes=e)
    terms["params"] += e * frozen
    terms["moments"] += 4 * len(units)
    return _three(terms)


def _three(terms: dict[str, float]) -> dict[str, float]:
    """Mixed precision's four terms folded into params, grads, optimizer (master + moments)."""
    return {
        "params": terms["params"],
        "grads": terms["grads"],
        "optimizer": terms["master"] + terms["moments"],
    }


def _need_adam(layout: Layout) -> None:
    if layout.optimizer != "adam":
        raise ValueError(
            f"Layout: zero={layout.zero} with optimizer={layout.optimizer!r}: the course's "
            "ZeRO and FSDP step Adam (K = 12 bytes of state per parameter in ZeRO's count)"
        )


def stage_layers(model: ModelSpec, layout: Layout) -> int:
    """Blocks on the first pipeline stage."""
    return len(three_d_theory.stage_layers(model.layers, layout.pp)[0])


def in_flight_microbatches(layout: Layout) -> float:
    """Micro-batches whose activations the first stage holds at its peak, in whole-stage
    units. Interleaved (Narayanan et al. 2021, section 2.2): p micro-batches of 1/v of the
    stage's layers plus (p-1) more chunk-sized warm-up ones, p·(1 + (p-1)/(p·v)); the exact
    walk of the schedule is `peak_activation_bytes`."""
    p, m = layout.pp, layout.microbatches
    if layout.schedule == "interleaved":
        return min(m, p) * (1 + (p - 1) / (p * layout.virtual))
    return pp_theory.peak_microbatches(0, p, m, layout.schedule)


def chunk_layers(model: ModelSpec, layout: Layout) -> list[int]:
    """Blocks of each model chunk of rank 0: virtual stages 0, p, 2p, ... of p·v (one chunk,
    its stage, without interleaving), dealt out as the pipeline lesson's `split_gpt` does."""
    p, v = layout.pp, layout.virtual if layout.schedule == "interleaved" else 1
    stages = three_d_theory.stage_layers(model.layers, p * v)
    return [len(stages[c * p]) for c in range(v)]


def peak_activation_bytes(layout: Layout, chunk_bytes: list[float]) -> float:
    """The most bytes rank 0's (micro-batch, chunk) activations reach while it walks its
    steps of the pipeline lesson's `schedule`: a forward adds its chunk's bytes, the step
    that last needs them (the backward; the weight gradient when the schedule splits it
    out, ZB-H1) frees them."""
    if layout.pp == 1:
        return chunk_bytes[0]
    steps = schedule(layout.schedule, layout.pp, layout.microbatches, layout.virtual)[0]
    frees = "W" if any(step[0] == "W" for step in steps) else "B"
    alive = peak = 0.0
    for step in steps:
        chunk = step[2] if len(step) > 2 else 0
        if step[0] == "F":
            alive += chunk_bytes[chunk]
            peak = max(peak, alive)
        elif step[0] == frees:
            alive -= chunk_bytes[chunk]
    return peak


def activations(model: ModelSpec, layout: Layout) -> float:
    """Bytes of activations rank 0 holds at its peak: each model chunk's blocks per
    micro-batch (`megatron.theory.activation_bytes_per_layer`, the course kernels: flash
    attention, no dropout; replicated outside tp regions, split inside), or with full
    recomputation each block's input (Chen et al. 2016) plus one block recomputed, summed
    over the micro-batches alive at the schedule's peak (`peak_activation_bytes`). The first
    chunk's embedding also saves its index tensors (`embedding_index_bytes`), and a rank
    that is also the last stage (pp = 1) the output head's and the loss's (`head_bytes`)."""
    if not model.has_config:
        return 0.0
    b, s, h, a = layout.micro_batch, model.seq, model.hidden, model.heads
    e = layout.element_bytes
    per_layer = tp_theory.activation_bytes_per_layer(b, s, h, a, layout.tp, e)
    indices = embedding_index_bytes(layout.global_batch // layout.dp, s)
    if layout.recompute:
        boundary = recompute_theory.boundary_bytes(s, b, h, e)
        held = [recompute_theory.saved_bytes(n, per_layer, boundary, 1)["forward"]
                for n in chunk_layers(model, layout)]  # fmt: skip
    else:
        held = [n * per_layer for n in chunk_layers(model, layout)]
    held[0] += indices
    if layout.pp == 1:
        held[0] += head_bytes(b, s, h, model.vocab, layout.tp, e)
    return peak_activation_bytes(layout, held) + recompute_working_bytes(model, layout)


def recompute_working_bytes(model: ModelSpec, layout: Layout) -> float:
    """What recomputation adds at the peak: one block's activations, rebuilt in backward."""
    if not (layout.recompute and model.has_config):
        return 0.0
    b, s, h, a = layout.micro_batch, model.seq, model.hidden, model.heads
    return tp_theory.activation_bytes_per_layer(b, s, h, a, layout.tp, layout.element_bytes)


def head_bytes(batch: int, seq: int, hidden: int, vocab: int, tp: int, element_bytes: int) -> int:
    """What the final LayerNorm, the output head and the cross entropy save for b sequences:
    the norm's input and its output (the head's input), b·s·h each, the norm's fp32 mean and
    1/std per token, the log-softmax over the vocabulary (split t ways: vocab-parallel cross
    entropy, Megatron-LM), the int64 targets, and the mean's 4-byte scalar."""
    bs = batch * seq
    padded_vocab = three_d_theory.padded_vocab(vocab, tp)
    return element_bytes * (2 * bs * hidden + bs * padded_vocab // tp) + 2 * 4 * bs + 8 * bs + 4


def embedding_index_bytes(replica_batch: int, seq: int) -> int:
    """What the token and position embeddings save per micro-batch: their int64 indices.
    A micro-batch's token ids are a view of its replica's batch, and autograd keeps the
    whole storage: 8·B·s bytes for B sequences, plus the positions' 8·s."""
    return 8 * replica_batch * seq + 8 * seq


def traffic(model: ModelSpec, layout: Layout) -> dict[tuple[str, str], float]:
    """{(collective, group): bytes} rank 0 sends per step on a ring (`comm.ring_bytes`)."""
    n, z, e, r = layout.dp, layout.zero, layout.element_bytes, layout.reduce_bytes
    if layout.tp > 1 or layout.pp > 1:
        cfg = model.layers, layout.global_batch, model.seq, model.hidden, model.vocab
        frozen = model.frozen_numel
        by_kind = three_d_theory.bytes_sent_per_step(
            0, layout.pp, *cfg, layout.tp, layout.dp, frozen
        )
        scale = e / 4  # the lessons count float32; every term is linear in the element size
        out = {("all_reduce", "tp"): scale * by_kind["tp"], ("p2p", "pp"): scale * by_kind["pp"]}
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
    units = model.fsdp_units() if model.has_config else [model.trainable]
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


def bus_traffic(model: ModelSpec, layout: Layout) -> dict[str, float]:
    """Bytes between device and host (and disk) per step when the optimizer is offloaded
    (lesson 05: every owned gradient down, every updated parameter up)."""
    if layout.offload == "device":
        return {}
    units = model.fsdp_units() if model.has_config else [model.trainable]
    f = shard_group(layout)
    owned = sum(fsdp_theory.padded(u, f) // f for u in units)
    e = layout.element_bytes
    out = dict(offload_theory.bytes_moved_per_step(owned, e, e))
    if layout.offload == "disk":
        out.update(offload_theory.disk_bytes_per_step(owned))
    return out


def bubble(layout: Layout) -> float:
    """The pipeline's idle share (`pipeline.theory.bubble_fraction`); 0 without a pipeline."""
    if layout.pp == 1:
        return 0.0
    kind = layout.schedule
    return pp_theory.bubble_fraction(layout.pp, layout.microbatches, kind, layout.virtual)


def flops_per_step(model: ModelSpec, layout: Layout) -> float:
    """FLOPs rank 0 computes per step: its stage's layers for its replica's sequences, split
    t ways (`megatron.theory.transformer_layer_flops`, 3x the forward; 4x with
    recomputation, which runs the forward twice), plus the output head's 6·b·s·h·V/t on
    the stage that has it (all of them when pp = 1)."""
    if not model.has_config:
        return 0.0
    b = layout.global_batch // layout.dp
    s, h = model.seq, model.hidden
    layer = tp_theory.transformer_layer_flops(b, s, h)
    if layout.recompute:
        layer *= 4 / 3
    head = 6 * b * s * h * model.vocab if layout.pp == 1 else 0.0
    return (stage_layers(model, layout) * layer + head) / layout.tp
