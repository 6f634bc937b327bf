"""Lesson 17's plan of what a rank holds and its data-parallel family's share: the
parameters a rank keeps after `parallelize`'s split (`rank_params`), the model states by
kind under ZeRO-1, ZeRO-2 or FSDP (`units`, `unit_collectives` replaying a unit's gathers
and reduce-scatters on the rank's schedule), with the optimizer offloaded or not, and the
dp group's bytes and the bus's (`dp_bytes`, `offload_bytes`). `theory.py` adds the other
group kinds and plans a run.
"""

from __future__ import annotations

import torch.nn as nn

from ..expert_parallel.gpt import is_expert
from ..ledger import ring_bytes
from ..megatron.plan import GPT_PLAN, LLAMA_PLAN
from ..model_parts import family
from ..pipeline.schedules import SPLIT_BACKWARD, schedule, virtual_stage
from ..zero import theory as zero_theory
from .holdings import _owner, _sizes, chunks, local_numel


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
