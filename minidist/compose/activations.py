"""The activations a composed rank keeps for backward, planned term by term (lesson 17).

What `SavedActivations` measures around each chunk's forward (and its loss), per micro-batch,
for the course's GPT, Llama and MoE on the composed path: every tensor autograd saves, each
storage once, parameters left out (Korthikanti et al. 2022, section 4.1, on this course's
CPU kernels: fused attention keeps its log-sum-exp, not the s² scores; no dropout). Then
the most the rank holds while it walks its steps of lesson 09's schedule: a forward adds its
chunk's bytes, the backward frees them (the W step, when the schedule splits it out, as the
engine's count does).

Where the composition moves a term:
- tensor parallelism splits what lives inside a region (heads and the MLP's width) t ways;
  each region keeps its input whole (gathered once under sequence parallelism: the
  projections' shared input, not Megatron's 1/t re-gathered in backward);
- sequence parallelism keeps the norms' inputs, outputs and statistics 1/t;
- context parallelism keeps 1/c of the tokens (ring attention saves what local attention
  would, on the rank's blocks);
- recomputation keeps each layer's input (Chen et al. 2016), nothing inside;
- bf16 halves the compute-type tensors; log-sum-exps, RMSNorm's float32 statistics and the
  loss's log-probabilities stay float32.

Not planned (`None`: measured only): the course MoE with ep > 1 unless recomputed (how many
rows a rank's experts receive follows the routing; recomputed, a layer keeps only its
input), transformers models.
"""

from __future__ import annotations

import torch.nn as nn

from ..model_parts import family
from ..pipeline.schedules import schedule
from ..pipeline.theory import peak_held
from .holdings import _sizes, chunks

IDS = 8  # int64 token ids, targets and positions


def _kind(model: nn.Module) -> str:
    """ "gpt", "moe" (the course GPT with MoE layers), "llama" or "hf"."""
    kind = family(model)
    return "moe" if kind == "gpt" and _sizes(model)["moes"] else kind


def _region(dims, seq: int, b: int) -> tuple[int, int]:
    """(tokens inside a tp region, tokens of a norm) of one micro-batch on one rank."""
    s = seq // dims.cp
    return b * s, b * s // (dims.tp if dims.sp else 1)


def layer_bytes(model: nn.Module, dims, b: int, e: int, recompute: bool) -> int:
    """Bytes one of the model's layers saves per micro-batch on a rank (e: the compute type's
    bytes per element)."""
    sz = _sizes(model)
    h, a, t = sz["hidden"], sz["heads"] // dims.tp, dims.tp
    tokens, normed = _region(dims, sz["seq_len"], b)
    if recompute:  # the layer's input only (its positions: once a chunk, `chunk_bytes`)
        return normed * h * e
    kind = _kind(model)
    if kind == "llama":
        ffn = model.cfg.ffn // t
        d = sz["head_dim"]
        norms = 2 * (normed * h * 4 + normed * 4 + normed * h * e)  # x in fp32, 1/rms, x/rms
        rope = 4 * (tokens // b) * d * e  # cos and sin, for q and for k
        attention = 4 * tokens * a * d * e + tokens * a * 4  # q, k, v, out; log-sum-exp
        if sz["kv_heads"] % t:  # K and V whole: each picks this rank's a heads (an index)
            attention += 2 * a * IDS
        mlp = 4 * tokens * ffn * e  # gate's and up's outputs, silu's, down's input
        return norms + 2 * tokens * h * e + rope + attention + mlp
    norms = 2 * (normed * h * e + 2 * normed * e)  # input, mean and 1/σ
    attention = 4 * tokens * h // t * e + tokens * a * 4  # q, k, v, out; log-sum-exp
    if kind == "moe":
        moe = sz["moes"][0]
        n, k = moe.num_experts, moe.k
        router = tokens * n * e + tokens * k * IDS + n * e  # probabilities, choices, load
        # per routed token: its row, its expert's output and weighted output, fc1's output
        # and GELU's (4h each), its gate, its (token, slot) index pair
        routed = tokens * k * (3 * h * e + 8 * h * e + e + 2 * IDS)
        return norms + 2 * tokens * h * e + attention + router + routed
    return norms + 2 * tokens * h * e + attention + 8 * tokens * h // t * e


def ends_bytes(model: nn.Module, dims, b: int, rows: int, e: int, first: bool, last: bool):
    """Bytes the embedding (first chunk) and the final norm, head and loss (last chunk) save
    per micro-batch: the ids (under tp the rank's masked copy and its mask, else a view of
    the replica's `rows` sequences, whose whole storage counts), the GPT's positions, the
    head's input, the loss's float32 log-probabilities (the rank's vocabulary slice under
    tp) and its targets."""
    sz = _sizes(model)
    h, t, s = sz["hidden"], dims.tp, sz["seq_len"] // dims.cp
    tokens, normed = _region(dims, sz["seq_len"], b)
    vocab = -(-model.lm_head.weight.shape[0] // t)  # padded to t's multiple, 1/t of it
    ids = tokens * (IDS + 1) if t > 1 else rows * s * IDS
    out = 0
    if first:
        out += ids + (s * IDS if family(model) != "llama" else 0)
    if last:
        if family(model) == "llama":
            out += normed * h * 4 + normed * 4 + normed * h * e
        else:
            out += normed * h * e + 2 * normed * e
        out += tokens * h * e + tokens * vocab * 4
        out += tokens * (IDS + 1) if t > 1 else rows * s * IDS + 4  # targets; the mean's count
    return out


def chunk_bytes(
    model: nn.Module, dims, micro_batch: int, rows: int, precision: str, recompute: bool, pp_rank
) -> list[int] | None:
    """Bytes each chunk of pipeline rank `pp_rank` saves per micro-batch; None where not
    planned (module docstring)."""
    kind = _kind(model)
    if kind not in ("gpt", "llama", "moe") or (kind == "moe" and dims.ep > 1 and not recompute):
        return None
    e = 2 if precision == "bf16" else 4
    layer = layer_bytes(model, dims, micro_batch, e, recompute)
    out = []
    for _, layers, first, last in chunks(dims, pp_rank, _sizes(model)["layers"]):
        held = len(layers) * layer + ends_bytes(model, dims, micro_batch, rows, e, first, last)
        if recompute and kind == "llama" and layers:  # the positions each layer is handed
            held += _sizes(model)["seq_len"] // dims.cp * IDS
        out.append(held)
    return out


def activation_bytes(
    model: nn.Module,
    dims,
    global_batch: int,
    micro_batch: int,
    precision: str = "fp32",
    recompute: bool = False,
    pp_rank: int = 0,
) -> int | None:
    """The most activation bytes pipeline rank `pp_rank` holds during a step: its schedule's
    steps walked with each chunk's `chunk_bytes` (lesson 09's `peak_held`: held from F to B,
    or to W where the schedule splits the backward)."""
    rows = global_batch // (dims.dp_replicate * dims.dp_shard)
    held = chunk_bytes(model, dims, micro_batch, rows, precision, recompute, pp_rank)
    if held is None:
        return None
    steps = schedule(dims.schedule, dims.pp, rows // micro_batch, dims.virtual)[pp_rank]
    return peak_held(steps, held)
