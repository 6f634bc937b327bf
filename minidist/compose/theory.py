"""What a composed layout holds and sends, planned from the lessons' own rules (lesson 17).

Every term is one lesson's, applied to what the rank holds after `parallelize`'s steps:
- the rank's chunks (`pipeline.schedules.virtual_stage`: one, `virtual` interleaved, or two
  in the V of ZB-V, DualPipeV) and in them the tensor-parallel share of each parameter, from
  lesson 07's plans (`megatron.plan`, the splits the engine's `compose.tensor_parallel`
  applies by module name): split styles keep 1/t (a row-parallel
  bias whole), K and V of grouped-query attention 1/t when t divides their heads, else
  whole; experts E/ep of them (lesson 16);
- model states: the parameters and gradients in the compute type, and ZeRO-1 over
  dp_shard × cp (lesson 02's flat, padded to a multiple of the group): a float32 master
  chunk and Adam's two moments per element of it (`zero.theory.padded_numel`);
  under `dp_shard_mode` ZeRO-2 or FSDP (`fsdp.py`) one such flat per unit (`units`: each
  layer's dense part, its experts', each chunk's root), a layer's parameters not held
  between steps under FSDP, and each unit's gathers and reduce-scatters replayed on the
  rank's schedule (`unit_collectives`), offloaded or not (these and the dp bytes:
  `dp_theory.py`);
- bytes per group kind, each collective's ring bytes (`comm.ring_bytes`): dp, ZeRO's
  reduce-scatter and all-gather of the float32 flat, HSDP's all-reduce of the gradients
  over dp_replicate; pp, one float32 activation per micro-batch and chunk edge that crosses
  ranks, each way (lesson 09), the loss's broadcast, the tied embedding's all-reduce
  (lesson 10); cp, ring attention's K/V blocks (`context_parallel.theory`); tp, each
  module's collectives per micro-batch (`tensor_bytes`; what a rank holds: `holdings`).
`tests/test_compose_theory.py` checks every figure against the ledger and the tensors of a
run, layouts sampled.
"""

from __future__ import annotations

import torch.nn as nn

from ..context_parallel import theory as cp_theory
from ..expert_parallel import theory as ep_theory
from ..ledger import ring_bytes
from ..model_parts import family
from ..pipeline.schedules import virtual_stage
from .activations import activation_bytes
from .dp_theory import (  # noqa: F401 (the states and the dp group's bytes, planned here too)
    dp_bytes,
    model_state_bytes,
    offload_bytes,
    rank_params,
    unit_collectives,
    units,
    zero1_flats,
)
from .holdings import _sizes, chunks
from .tensor_bytes import tp_bytes  # noqa: F401 (the tp group's count, planned here too)


def pp_bytes(
    model: nn.Module,
    dims,
    micro_batch: int,
    microbatches: int,
    precision: str = "fp32",
    pp_rank: int = 0,
) -> float:
    """A rank's float32 activations and their gradients to other ranks, every micro-batch;
    the loss's broadcast; the GPT's tied embedding all-reduced between its two ranks."""
    sizes = _sizes(model)
    if dims.pp == 1:
        return 0.0
    s = sizes["seq_len"] // dims.cp // (dims.tp if dims.sp else 1)
    act = 4 * micro_batch * s * sizes["hidden"]
    stages = dims.pp * dims.chunks
    where = {
        virtual_stage(dims.schedule, r, c, dims.pp): r
        for r in range(dims.pp)
        for c in range(dims.chunks)
    }
    sent = 0.0
    mine = chunks(dims, pp_rank, sizes["layers"])
    for vs, _, first, last in mine:
        if not last and where[vs + 1] != pp_rank:
            sent += microbatches * act
        if not first and where[vs - 1] != pp_rank:
            sent += microbatches * act
    sent += ring_bytes("broadcast", 4, dims.pp)
    ends = {where[0], where[stages - 1]}
    if family(model) == "gpt" and len(ends) == 2 and pp_rank in ends:
        e = 2 if precision == "bf16" else 4
        vocab = model.tok_emb.weight.shape[0]
        sent += ring_bytes("all_reduce", e * vocab // dims.tp * sizes["hidden"], 2)
    return sent


def cp_bytes(
    model: nn.Module,
    dims,
    micro_batch: int,
    microbatches: int,
    precision: str = "fp32",
    recompute: bool = False,
    pp_rank: int = 0,
) -> float:
    """Ring attention's K and V blocks and their gradients (lesson 15), per layer of rank 0's
    chunks and micro-batch; K and V carry this tp rank's query heads (h/t wide)."""
    if dims.cp == 1:
        return 0.0
    sizes = _sizes(model)
    e = 2 if precision == "bf16" else 4
    ring = cp_theory.ring_bytes_per_layer(
        micro_batch, sizes["seq_len"], sizes["hidden"] // dims.tp, dims.cp, e
    )
    total = 0.0
    for _, layers, _, _ in chunks(dims, pp_rank, sizes["layers"]):
        backward = ring["backward K, V"] + ring["backward dK, dV"]  # in B under a split
        forward = ring["forward"] * (2 if recompute else 1)
        total += len(layers) * (forward + backward)
    return microbatches * total


def ep_bytes(
    model: nn.Module,
    dims,
    global_batch: int,
    micro_batch: int,
    precision: str = "fp32",
    recompute: bool = False,
    padded: bool = False,
    pp_rank: int = 0,
) -> float:
    """The experts' all-to-alls a rank sends per step over its ep group (lesson 16), the
    most over its MoE layers' routing. Per layer and micro-batch of T = b·s/c tokens, with
    C = ⌈cf·T·k/E⌉: padded to capacity (`padded`, GShard's static shapes) exactly E/e·C rows
    to each of the e-1 others in each of the four all-to-alls; exact, at most min(T·k,
    (e-1)·E/e·C) rows out (its kept assignments, none to itself) and from each peer
    min(T·k, E/e·C) in, plus the E/e counts per peer (int64). A recomputed forward
    exchanges again."""
    if dims.ep == 1:
        return 0.0
    sizes = _sizes(model)
    moe = next(m for m in model.modules() if hasattr(m, "num_experts") and hasattr(m, "router"))
    e, n, k = dims.ep, moe.num_experts, moe.k
    tokens = micro_batch * sizes["seq_len"] // dims.cp
    cap = ep_theory.capacity(tokens, n, k, moe.capacity_factor)
    peers = (e - 1) * (n // e) * cap
    row = sizes["hidden"] * (2 if precision == "bf16" else 4)
    if padded:
        out_rows, in_rows, counts = peers, peers, 0.0
    else:
        out_rows, counts = min(tokens * k, peers), ep_theory.counts_bytes(n, e)
        in_rows = (e - 1) * min(tokens * k, n // e * cap)
    forward = counts + (out_rows + in_rows) * row  # dispatch out; combine: what came in
    backward = (in_rows + out_rows) * row  # their gradients, the other way
    m = global_batch // (dims.dp_replicate * dims.dp_shard * micro_batch)
    layers = sum(len(held) for _, held, _, _ in chunks(dims, pp_rank, sizes["layers"]))
    return m * layers * (forward * (2 if recompute else 1) + backward)


def ep_bytes_bound(
    model: nn.Module, dims, global_batch: int, micro_batch: int, precision: str = "fp32"
) -> float:
    """`ep_bytes` of the exact exchange, the most over the pipeline ranks: what no routing
    exceeds."""
    args = (model, dims, global_batch, micro_batch, precision)
    return max(ep_bytes(*args, pp_rank=r) for r in range(dims.pp))


def planned(
    model: nn.Module,
    dims,
    global_batch: int,
    micro_batch: int,
    precision: str = "fp32",
    recompute: bool = False,
    dp_shard_mode: str = "optim",
    reshard_after_forward: bool = True,
    valid_token_mean: bool = False,
    offload: bool = False,
) -> dict:
    """{"memory": {kind: bytes}, "bytes": {kind: bytes}}, the most over the pipeline ranks
    (every tp, cp and dp rank of a stage holds and sends as much), as `python -m minidist
    train` prints them beside the measured ones; `valid_token_mean`: the loss's count of
    valid targets, one float64 all-reduced over the data ranks each step (dp); `offload`:
    the host's states and the bus's bytes (`offload_bytes`); the activations' peak
    (`activations.activation_bytes`) where it is planned."""
    m = global_batch // (dims.dp_replicate * dims.dp_shard * micro_batch)
    memory, sent = {}, {}
    for r in range(dims.pp):
        states = model_state_bytes(model, dims, precision, r, dp_shard_mode, offload)
        args = (model, dims, micro_batch, m, precision)
        dp = dp_bytes(model, dims, precision, r, dp_shard_mode, m, reshard_after_forward)
        if offload:  # the copies over the bus, beside the network's kinds
            bus = (model, dims, precision, r, dp_shard_mode, m, reshard_after_forward)
            for way, n in offload_bytes(*bus).items():
                sent[way] = max(sent.get(way, 0), n)
        if valid_token_mean:
            dp += ring_bytes("all_reduce", 8, dims.dp_replicate * dims.dp_shard * dims.cp)
        kinds = {"dp": dp, "pp": pp_bytes(*args, r)}
        kinds.update(
            cp=cp_bytes(*args, recompute, r), tp=tp_bytes(*args, recompute, r, dp_shard_mode)
        )
        acts = activation_bytes(model, dims, global_batch, micro_batch, precision, recompute, r)
        if acts is not None:
            states["activations"] = acts
        for k, v in states.items():
            memory[k] = max(memory.get(k, 0), v)
        for k, v in kinds.items():
            sent[k] = max(sent.get(k, 0.0), v)
    return {"memory": memory, "bytes": sent}
