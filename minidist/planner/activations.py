"""Activation memory of rank 0 for a (model, layout): what its blocks, its embedding and (on
the last stage) its head and loss keep for backward, at the peak of its pipeline schedule.

Per block: `megatron.theory.activation_bytes_per_layer` (Korthikanti et al. 2022, section
4.1, on the course kernels: flash attention, no dropout; replicated outside the tensor-
parallel regions, split inside), or with full recomputation only the block's input
(Chen et al. 2016, `recompute.theory.saved_bytes`) plus one block rebuilt in backward. The
peak comes from walking rank 0's steps of the pipeline lesson's `schedule`; with ZB-V and
DualPipeV rank 0's two chunks are virtual stages 0 and 2p-1 of 2p, the embedding's and the
head's.

Sequence parallelism (lesson 14) stores the blocks' replicated parts 1/t each
(`sequence_parallel.theory.activation_bytes_per_layer`); context parallelism (lesson 15)
keeps 1/c of every sequence's tokens on a rank, so every activation is 1/c.
"""

from __future__ import annotations

from ..megatron import theory as tp_theory
from ..pipeline import theory as pp_theory
from ..pipeline.schedules import V_SHAPED, schedule, virtual_stage
from ..recompute import theory as recompute_theory
from ..sequence_parallel import theory as sp_theory
from ..three_d import theory as three_d_theory
from . import llama
from .spec import Layout, ModelSpec

MEAN_BYTES = 4  # the float32 scalar the cross entropy's mean saves (lesson 07's keeps none)


def v_shaped(layout: Layout) -> bool:
    """Two chunks per rank in a V (ZB-V, DualPipeV): rank 0 holds virtual stages 0 and 2p-1
    of 2p (`pipeline.schedules.virtual_stage`), the embedding and the head both."""
    return layout.pp > 1 and layout.schedule in V_SHAPED


def holds_head(layout: Layout) -> bool:
    """Whether rank 0 also holds the last (virtual) stage: the final norm, head and loss."""
    return layout.pp == 1 or v_shaped(layout)


def virtual_stages(layout: Layout) -> tuple[int, list[int]]:
    """(the pipeline's virtual stages, the ones rank 0 holds as its chunks): 0, p, 2p, ... of
    p·v interleaved, 0 and 2p-1 of 2p in a V, stage 0 of p otherwise
    (`pipeline.schedules.virtual_stage`)."""
    p = layout.pp
    chunks = 2 if v_shaped(layout) else layout.virtual if layout.schedule == "interleaved" else 1
    if p == 1:
        return 1, [0]
    return p * chunks, [virtual_stage(layout.schedule, 0, c, p) for c in range(chunks)]


def stage_layers(model: ModelSpec, layout: Layout) -> int:
    """Blocks rank 0 holds: its stage's, or all its chunks'."""
    if len(virtual_stages(layout)[1]) > 1:
        return sum(chunk_layers(model, layout))
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
    its stage, without interleaving), or 0 and 2p-1 of 2p in a V, dealt out as the pipeline
    lesson's `split_gpt` does."""
    if layout.pp == 1 and layout.schedule == "interleaved":  # no pipeline: v chunks in a row
        stages = three_d_theory.stage_layers(model.layers, layout.virtual)
        return [len(stage) for stage in stages]
    total, held = virtual_stages(layout)
    stages = three_d_theory.stage_layers(model.layers, total)
    return [len(stages[k]) for k in held]


def peak_activation_bytes(layout: Layout, chunk_bytes: list[float]) -> float:
    """The most bytes rank 0's (micro-batch, chunk) activations reach while it walks its
    steps of the pipeline lesson's `schedule`: a forward adds its chunk's bytes, the step
    that last needs them (the backward; the weight gradient when the schedule splits it
    out: ZB-H1, ZB-V, DualPipeV) frees them. In a V, chunk 1 is the last virtual stage."""
    if layout.pp == 1:
        return chunk_bytes[0]
    v = layout.virtual if layout.schedule == "interleaved" else 1
    return pp_theory.peak_held(
        schedule(layout.schedule, layout.pp, layout.microbatches, v)[0], chunk_bytes
    )


def activations(model: ModelSpec, layout: Layout) -> float:
    """Bytes of activations rank 0 holds at its peak: each model chunk's blocks per
    micro-batch (`megatron.theory.activation_bytes_per_layer`, the course kernels: flash
    attention, no dropout; replicated outside tp regions, split inside), or with full
    recomputation each block's input (Chen et al. 2016) plus one block recomputed, summed
    over the micro-batches alive at the schedule's peak (`peak_activation_bytes`). The first
    chunk's embedding also saves its index tensors (`embedding_index_bytes`), and a rank's
    chunk that is also the last stage (pp = 1; chunk 1 in a V) the output head's and the
    loss's (`head_bytes`).
    Sequence parallelism keeps each block's input and the final norm's 1/t (its sequence
    block); the embedding as lesson 07's. Context parallelism: all of it over c (the loss's
    mean scalar aside: one per rank). MoE blocks (`model.experts`, padded to capacity): an
    upper bound, every expert slot the rank's tokens can fill filled (`experts.layer_bytes`)."""
    if not model.has_config:
        return 0.0
    b, s, h = layout.micro_batch, model.seq, model.hidden
    e = layout.element_bytes
    per_layer = layer_bytes(model, layout) * layout.cp  # all of it is divided by c below
    indices = embedding_index_bytes(layout.global_batch // layout.dp, s, b, layout.tp, layout.sp)
    if model.arch == "llama":  # no position embedding
        indices -= 8 * (s // layout.tp if layout.sp else s)
    if layout.recompute:
        kept = s // layout.tp if layout.sp else s  # the block's input: this rank's block
        boundary = recompute_theory.boundary_bytes(kept, b, h, e)
        held = [
            recompute_theory.saved_bytes(n, per_layer, boundary, 1)["forward"]
            for n in chunk_layers(model, layout)
        ]
    else:
        held = [n * per_layer for n in chunk_layers(model, layout)]
    held[0] += indices
    if holds_head(layout) and model.arch == "llama":
        held[-1] += llama.head_bytes(b, model, layout, b * s if layout.tp > 1 else MEAN_BYTES)
    elif holds_head(layout):
        held[-1] += head_bytes(b, s, h, model.vocab, layout.tp, e, layout.sp)
    if v_shaped(layout):  # the targets are a view of the replica's batch, as the ids are
        held[-1] += 8 * (layout.global_batch // layout.dp - b) * s
    # context parallelism: every activation is per token, 1/c, but the loss's mean scalar
    scalar = MEAN_BYTES if layout.pp == 1 and layout.tp == 1 else 0
    peak = (peak_activation_bytes(layout, held) - scalar) / layout.cp + scalar
    return peak + recompute_working_bytes(model, layout)


def layer_bytes(model: ModelSpec, layout: Layout) -> float:
    """What one block saves for backward per micro-batch on rank 0: lesson 07's
    `megatron.theory.activation_bytes_per_layer`, lesson 14's
    `sequence_parallel.theory.activation_bytes_per_layer` when `sp`, over c with `cp`."""
    b, s, h, a = layout.micro_batch, model.seq, model.hidden, model.heads
    t, e = layout.tp, layout.element_bytes
    if model.arch == "llama":
        return llama.layer_bytes(model, layout) / layout.cp
    if model.experts:  # lesson 16's MoE blocks (tp = sp = cp = 1 there)
        from .experts import layer_bytes as moe_layer_bytes

        return moe_layer_bytes(model, layout)
    if layout.sp:
        per_layer = sp_theory.activation_bytes_per_layer(s, b, h, a, t, True, e)
    else:
        per_layer = tp_theory.activation_bytes_per_layer(b, s, h, a, t, e)
    return per_layer / layout.cp


def recompute_working_bytes(model: ModelSpec, layout: Layout) -> float:
    """What recomputation adds at the peak: one block's activations, rebuilt in backward."""
    if not (layout.recompute and model.has_config):
        return 0.0
    return layer_bytes(model, layout)


def head_bytes(
    batch: int, seq: int, hidden: int, vocab: int, tp: int, element_bytes: int, sp: bool = False
) -> int:
    """What the final LayerNorm, the output head and the cross entropy save for b sequences:
    the norm's input and its output (the head's input), b·s·h each, the norm's fp32 mean and
    1/std per token, the log-softmax over the vocabulary (split t ways: vocab-parallel cross
    entropy, Megatron-LM), the int64 targets, and the mean's 4-byte scalar. With sequence
    parallelism the norm runs on this rank's block of the sequence: its input and its
    statistics are 1/t (the head's input is the all-gathered whole). With t > 1 the
    vocab-parallel cross entropy keeps a bool mask of the targets in its shard, and no
    mean scalar (its own backward)."""
    bs = batch * seq
    norm = bs // tp if sp else bs
    padded_vocab = three_d_theory.padded_vocab(vocab, tp)
    logits = element_bytes * (norm * hidden + bs * hidden + bs * padded_vocab // tp)
    loss = 8 * bs + (bs if tp > 1 else MEAN_BYTES)
    return logits + 2 * 4 * norm + loss


def embedding_index_bytes(
    replica_batch: int, seq: int, micro_batch: int = 0, tp: int = 1, sp: bool = False
) -> int:
    """What the token and position embeddings save per micro-batch: their int64 indices.
    A micro-batch's token ids are a view of its replica's batch, and autograd keeps the
    whole storage: 8·B·s bytes for B sequences, plus the positions' 8·s (this rank's block
    of them, s/t, with sequence parallelism). The vocab-parallel embedding (t > 1) looks
    up its shifted ids instead, a new tensor of the micro-batch's b·s, and keeps a bool
    mask of those outside its shard, b·s bytes."""
    positions = 8 * (seq // tp if sp else seq)
    if tp == 1:
        return 8 * replica_batch * seq + positions
    return 9 * micro_batch * seq + positions
