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
  rank's schedule (`unit_collectives`);
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
from ..expert_parallel.gpt import is_expert
from ..ledger import ring_bytes
from ..megatron.plan import GPT_PLAN, LLAMA_PLAN
from ..model_parts import family
from ..pipeline.schedules import SPLIT_BACKWARD, schedule, virtual_stage
from ..zero import theory as zero_theory
from .holdings import _owner, _sizes, chunks, local_numel
from .tensor_bytes import tp_bytes  # noqa: F401 (the tp group's count, planned here too)


def rank_params(model: nn.Module, dims, pp_rank: int = 0, ep_rank: int = 0) -> dict:
    """{"dense": elements, "dense_trainable", "expert", "expert_trainable"} this rank holds."""
    out = dict.fromkeys(("dense", "dense_trainable", "expert", "expert_trainable"), 0)
    for _, _, key, n, trainable in _held(model, dims, pp_rank, ep_rank):
        out[key] += n
        out[key + "_trainable"] += n if trainable else 0
    return out


def _held(model: nn.Module, dims, pp_rank: int, ep_rank: int):
    """(chunk, layer or None, "dense" | "expert", elements, trainable) of every parameter
    this rank holds."""
    kind, sizes = family(model), _sizes(model)
    plan = GPT_PLAN if kind == "gpt" else LLAMA_PLAN
    experts = sizes["experts"]
    per = experts // dims.ep if experts else 0
    for c, (_, layers, first, last) in enumerate(chunks(dims, pp_rank, sizes["layers"])):
        named = list(model.named_parameters())
        if kind == "gpt" and last and not first:  # the last chunk's copy of the embedding
            named.append(("lm_head.weight", model.tok_emb.weight))
        for name, p in named:
            if not _owner(kind, name, first, last, layers):
                continue
            if kind == "gpt" and name == "lm_head.weight":
                plan_name = "lm_head.weight"
            else:
                plan_name = name
            n = local_numel(model, plan_name, p.numel(), dims.tp, plan)
            if experts and is_expert(name):
                e = int(name.split(".experts.")[1].split(".")[0])
                if dims.ep > 1 and not ep_rank * per <= e < (ep_rank + 1) * per:
                    continue
                key = "expert" if dims.ep > 1 else "dense"
            else:
                key = "dense"
            parts = name.split(".")
            layer = int(parts[1]) if parts[0] == "blocks" else None
            layer = int(parts[2]) if parts[:2] == ["model", "layers"] else layer
            yield c, layer, key, n, p.requires_grad


def units(model: nn.Module, dims, pp_rank: int = 0) -> list[tuple[int, int, int, bool]]:
    """ZeRO-2/3's units on this rank (`fsdp.py`): (chunk, trainable elements, shard group
    size, a layer's or the root's), each layer's dense and expert parts apart."""
    groups = {"dense": dims.dp_shard * dims.cp, "expert": dims.dp_shard * dims.cp // dims.ep}
    sums: dict = {}
    for c, layer, key, n, trainable in _held(model, dims, pp_rank, 0):
        if trainable:
            at = (c, layer is None, -1 if layer is None else layer, key == "expert")
            sums[at] = sums.get(at, 0) + n
    return [
        (c, n, groups["expert" if expert else "dense"], not root)
        for (c, root, _, expert), n in sorted(sums.items())
    ]


def unit_collectives(dims, microbatches: int, pp_rank: int, chunk: int, reshard: bool):
    """(all-gathers, reduce-scatters) of one layer unit of `chunk` in a step under ZeRO-3
    (`fsdp.py`'s rules, replayed on the rank's schedule): gathered at a forward unless
    held, freed after it (`reshard`) unless a W is still owed; gathered again at its
    backward's start (B, or W for the first stage under a split backward, whose B is
    empty), reduced and freed when W (or the whole backward) has accumulated its
    gradients."""
    steps = schedule(dims.schedule, dims.pp, microbatches, dims.virtual)[pp_rank]
    split = dims.schedule in SPLIT_BACKWARD
    first = virtual_stage(dims.schedule, pp_rank, chunk, dims.pp) == 0
    gathered, pending, gathers, reduces = False, 0, 0, 0
    for op, _, *c in steps:
        if (c[0] if c else 0) != chunk:
            continue
        begins = op == "B" and not (split and first) or op == "W" and first
        ends = op == "W" or op == "B" and not split
        if op == "F":
            gathers, gathered = gathers + (not gathered), True
            gathered = gathered and not (reshard and pending == 0)
        if begins:
            gathers, gathered, pending = gathers + (not gathered), True, pending + 1
        if ends:
            reduces, pending = reduces + 1, pending - 1
            gathered = gathered and pending > 0
    return gathers, reduces


def zero1_flats(held: dict, dims) -> list[tuple[int, int]]:
    """ZeRO-1's flats on a rank: (trainable elements, group size), the dense parameters'
    over dp_shard × cp and the experts' over their ep_shard group (when the rank holds any)."""
    flats = (
        (held["dense_trainable"], dims.dp_shard * dims.cp),
        (held["expert_trainable"], dims.dp_shard * dims.cp // dims.ep),
    )
    return [(n, g) for n, g in flats if n]


def model_state_bytes(
    model: nn.Module,
    dims,
    precision: str = "fp32",
    pp_rank: int = 0,
    mode: str = "optim",
    offload: bool = False,
) -> dict[str, int]:
    """{params, grads, master, optimizer}: bytes a rank of pipeline rank `pp_rank` keeps
    between steps (grads: at the backward's end; ZeRO-2/3: the root's whole, every layer
    unit's reduced chunk, as if every expert got a token). `offload` (lesson 05): the
    float32 chunks, their reduced gradients and Adam's state as `host_*`, none on the
    device."""
    e = 2 if precision == "bf16" else 4
    held = rank_params(model, dims, pp_rank)
    if mode != "optim":
        mine = units(model, dims, pp_rank)
        chunk = sum(zero_theory.padded_numel([n], g) // g for _, n, g, _ in mine)
        freed = sum(n for _, n, _, layer in mine if layer) if mode == "optim_grads_params" else 0
        root = sum(n for _, n, _, layer in mine if not layer)
        layer_chunks = sum(zero_theory.padded_numel([n], g) // g for _, n, g, lr in mine if lr)
        out = {
            "params": e * (held["dense"] + held["expert"] - freed),
            "grads": e * root + 4 * layer_chunks,
            "master": 4 * chunk,
            "optimizer": 8 * chunk,
        }
        host_grads = 4 * layer_chunks  # the chunks the backward reduced (the root's: later)
        device_grads = out["grads"] - host_grads
    else:
        chunk = sum(zero_theory.padded_numel([n], g) // g for n, g in zero1_flats(held, dims))
        out = {
            "params": e * (held["dense"] + held["expert"]),
            "grads": e * (held["dense_trainable"] + held["expert_trainable"]),
            "master": 4 * chunk,
            "optimizer": 8 * chunk,
        }
        host_grads = 4 * chunk  # the reduced chunk, gone down in the step
        device_grads = out["grads"]  # the full gradients the backward left
    if offload:
        out.update(host_master=out["master"], host_optimizer=out["optimizer"], master=0)
        out.update(host_grads=host_grads, grads=device_grads, optimizer=0)
    return out


def offload_bytes(
    model: nn.Module,
    dims,
    precision: str = "fp32",
    pp_rank: int = 0,
    mode: str = "optim",
    microbatches: int = 1,
    reshard_after_forward: bool = True,
) -> dict[str, int]:
    """Bytes a rank copies between the device and the host in one step with the optimizer
    offloaded (lesson 05's bus, not the network): each reduced float32 gradient chunk down,
    each chunk up for an all-gather (float32 after the update; FSDP's gathers in the compute
    type, cast on the host), HSDP's chunks up and down around their all-reduce."""
    e = 2 if precision == "bf16" else 4
    down = up = 0
    if mode == "optim":
        for n, g in zero1_flats(rank_params(model, dims, pp_rank), dims):
            c = zero_theory.padded_numel([n], g) // g
            down, up = down + 4 * c, up + 4 * c
        return {"device_to_host": down, "host_to_device": up}
    for chunk, n, g, layer in units(model, dims, pp_rank):
        c = zero_theory.padded_numel([n], g) // g
        if dims.dp_replicate > 1:
            down, up = down + 4 * c, up + 4 * c
        if not layer:  # the root: reduced once, gathered after the update
            down, up = down + 4 * c, up + 4 * c
        elif mode == "optim_grads":
            down, up = down + microbatches * 4 * c, up + 4 * c
        else:
            gathers, reduces = unit_collectives(
                dims, microbatches, pp_rank, chunk, reshard_after_forward
            )
            down, up = down + reduces * 4 * c, up + gathers * e * c
    return {"device_to_host": down, "host_to_device": up}


def dp_bytes(
    model: nn.Module,
    dims,
    precision: str = "fp32",
    pp_rank: int = 0,
    mode: str = "optim",
    microbatches: int = 1,
    reshard_after_forward: bool = True,
) -> float:
    """ZeRO-1's reduce-scatter and all-gather of the float32 flats (dense over dp_shard × cp,
    experts over their shard group) and HSDP's all-reduce of every gradient; ZeRO-2/3: per
    unit (`units`), the float32 reduce-scatter of each micro-batch's gradients (the root's
    once), ZeRO-2's float32 all-gather after the update, ZeRO-3's gathers in the compute
    type (`unit_collectives`), HSDP's all-reduce of the float32 chunks."""
    e = 2 if precision == "bf16" else 4
    if mode != "optim":
        out, chunks_ = 0.0, 0
        for c, n, g, layer in units(model, dims, pp_rank):
            padded = zero_theory.padded_numel([n], g)
            chunks_ += padded // g
            if not layer:  # the root: one reduce-scatter, the update's all-gather
                out += ring_bytes("reduce_scatter", 4 * padded, g)
                out += ring_bytes("all_gather", 4 * padded, g)
            elif mode == "optim_grads":
                out += microbatches * ring_bytes("reduce_scatter", 4 * padded, g)
                out += ring_bytes("all_gather", 4 * padded, g)
            else:
                gathers, reduces = unit_collectives(
                    dims, microbatches, pp_rank, c, reshard_after_forward
                )
                out += reduces * ring_bytes("reduce_scatter", 4 * padded, g)
                out += gathers * ring_bytes("all_gather", e * padded, g)
        return out + ring_bytes("all_reduce", 4 * chunks_, dims.dp_replicate)
    held = rank_params(model, dims, pp_rank)
    out = 0.0
    for n, g in zero1_flats(held, dims):
        padded = zero_theory.padded_numel([n], g)
        out += ring_bytes("reduce_scatter", 4 * padded, g)
        out += ring_bytes("all_gather", 4 * padded, g)
    trainable = held["dense_trainable"] + held["expert_trainable"]
    return out + ring_bytes("all_reduce", e * trainable, dims.dp_replicate)


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
    the host's states and the bus's bytes (`offload_bytes`)."""
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
        kinds.update(cp=cp_bytes(*args, recompute, r), tp=tp_bytes(*args, recompute, r))
        for k, v in states.items():
            memory[k] = max(memory.get(k, 0), v)
        for k, v in kinds.items():
            sent[k] = max(sent.get(k, 0.0), v)
    return {"memory": memory, "bytes": sent}
