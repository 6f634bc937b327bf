"""Torch's own composition of the same layout, the other side of `bench compose`.

What torch 2.13 composes on gloo and CPUs (checked by `tests/test_compose_torch_native.py`
against one process): FSDP2's `fully_shard` over the dp mesh dimension (a 2-D
(dp_replicate, dp_shard) mesh for HSDP), DTensor tensor parallelism with sequence parallelism
(`parallelize_module` with the plan of torchtitan's `apply_tp` for Llama 3, as its 0.2
releases ship it (its main branch, 0.2.2 in August 2026, moves the same plan into each
module's own `parallelize`): `ColwiseParallel`,
`RowwiseParallel`, `SequenceParallel`, `PrepareModuleInput(Shard(1) -> Replicate())` with
`use_local_output=False`, so each module input is gathered once), and
`torch.distributed.pipelining`'s `PipelineStage` with GPipe, 1F1B, interleaved 1F1B, ZB-V
and DualPipeV, on one `init_device_mesh("cpu", ...)`. What it does not: `context_parallel`
(`torch.distributed.tensor.experimental`) dispatches SDPA to CUDA-only ring kernels and has
no CPU rule, so cp = 1 here; expert parallelism has no torch-native module; DTensor's plan
has no style for a fused Q, K, V (Phi3, GPT-2), and a tied head (Gemma, GPT-2) is refused
with pp or tp (pipelining keeps no tied copies; the plan makes two tensors of it).

The model is lesson 17's Llama (`minidist.models_llama`) or any transformers causal LM with
separate projections; each stage is `compose.split`'s edited copy of it, so the model's own
forward runs here too (torchtitan's `pipeline_module_split`).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..model_parts import find_parts, hf_sizes, is_hf
from ..pipeline.schedules import V_SHAPED
from ..pipeline.stages import Stage, StageContext
from .split import split_model
from .tensor_parallel import _localize

SCHEDULES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved": "ScheduleInterleaved1F1B",
    "zb-v": "ScheduleZBVZeroBubble",
    "dualpipev": "ScheduleDualPipeV",
}


def stage_indices(pp: int, chunks: int, schedule: str, pp_rank: int) -> list[int]:
    """The virtual stages a pp rank runs: round-robin (interleaved), V-shaped (ZB-V,
    DualPipeV)."""
    if schedule in V_SHAPED:
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + c * pp for c in range(chunks)]


def tensor_parallel(stage: Stage, mesh, sequence_parallel: bool, sizes: dict) -> None:
    """torchtitan's Llama plan (`parallelize_llama`'s `apply_tp`) on one stage, in the
    projections' Hugging Face names; the attention's head counts made the rank's."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    seq = Shard(1) if sequence_parallel else Replicate()
    t, hf = mesh.size(), is_hf(stage.model)
    if sizes["kv_heads"] % t:
        raise ValueError(
            f"torch_native: tp={t} must divide the KV heads={sizes['kv_heads']} "
            "(ColwiseParallel splits K and V by rows)"
        )
    for layer in stage.layers():
        attn = layer.self_attn
        plan = {
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=seq),
            "mlp.down_proj": RowwiseParallel(output_layouts=seq),
        }
        if sequence_parallel:
            plan.update(
                {
                    "input_layernorm": SequenceParallel(),
                    "post_attention_layernorm": SequenceParallel(),
                    "self_attn": PrepareModuleInput(  # transformers pass hidden_states by name
                        input_layouts=None if hf else (seq, None),
                        desired_input_layouts=None if hf else (Replicate(), None),
                        input_kwarg_layouts={"hidden_states": seq} if hf else None,
                        desired_input_kwarg_layouts={"hidden_states": Replicate()} if hf else None,
                    ),
                    "mlp": PrepareModuleInput(
                        input_layouts=(seq,), desired_input_layouts=(Replicate(),)
                    ),
                }
            )
        parallelize_module(layer, mesh, plan)
        _localize(attn, sizes, t, kv_whole=False)
    parts, model = stage.parts, stage.model
    if stage.first:
        embed = f"{_base_name(model, parts)}{parts.embeddings[0]}"
        whole = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        parallelize_module(model, mesh, {embed: whole})
        if sequence_parallel:  # this rank's block of the sequence, without communication
            rest = () if hf else (None,)  # lesson 17's Llama passes the positions too
            parallelize_module(
                stage.layers()[0],
                mesh,
                PrepareModuleInput(
                    input_layouts=(Replicate(), *rest),
                    desired_input_layouts=(Shard(1), *rest),
                    use_local_output=True,
                ),
            )
    if stage.last:
        top = {parts.head: ColwiseParallel(input_layouts=seq, output_layouts=Replicate())}
        if sequence_parallel:
            top[f"{_base_name(model, parts)}{parts.norm}"] = SequenceParallel()
        parallelize_module(model, mesh, top)


def _base_name(model: nn.Module, parts) -> str:
    name = next(n for n, m in model.named_modules() if m is parts.base)
    return f"{name}." if name else ""


def build(model: nn.Module, dims, loss_fn, microbatches: int, device: torch.device, seq_len: int):
    """(stage modules of this rank, torch's schedule, the mesh) for `dims` (a
    `ParallelDims`-like object: dp_replicate, dp_shard, tp, sp, pp, schedule, virtual; cp
    and ep must be 1) on this rank, for sequences of `seq_len`."""
    import torch.distributed.pipelining as pipelining
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if getattr(dims, "cp", 1) != 1 or getattr(dims, "ep", 1) != 1:
        raise ValueError(
            "torch_native.build: torch 2.13 composes no context parallelism on "
            "CPUs and has no expert parallelism: cp and ep must be 1"
        )
    if dims.schedule not in SCHEDULES:
        raise ValueError(
            f"torch_native.build: schedule={dims.schedule!r} is not one of {tuple(SCHEDULES)}"
        )
    if (dims.pp > 1 or dims.tp > 1) and find_parts(model).tied:
        raise ValueError(
            "torch_native.build: a tied head with pp > 1 or tp > 1 (torch's "
            "pipelining keeps no tied copies; DTensor's plan splits the "
            "embedding by rows and the head by columns, two tensors)"
        )
    shape = (dims.pp, dims.dp_replicate, dims.dp_shard, dims.tp)
    mesh = init_device_mesh(
        device.type, shape, mesh_dim_names=("pp", "dp_replicate", "dp_shard", "tp")
    )
    chunks = 2 if dims.schedule in V_SHAPED else dims.virtual
    virtual = dims.pp * chunks
    ctx = StageContext(torch.arange(seq_len, device=device), seq_len)
    sizes = _sizes(model)
    mods, stages = [], []
    for s in stage_indices(dims.pp, chunks, dims.schedule, mesh["pp"].get_local_rank()):
        mod = split_model(model, virtual, s, ctx)
        if dims.tp > 1:
            tensor_parallel(mod, mesh["tp"], dims.sp, sizes)
        if dims.dp_replicate * dims.dp_shard > 1:
            dp = mesh["dp_replicate", "dp_shard"]
            for layer in mod.layers():
                fully_shard(layer, mesh=dp, reshard_after_forward=False)
            fully_shard(mod, mesh=dp, reshard_after_forward=False)
        mods.append(mod)
        stages.append(
            pipelining.PipelineStage(mod, s, virtual, device, group=mesh["pp"].get_group())
        )
    cls = getattr(pipelining, SCHEDULES[dims.schedule])
    one = dims.schedule in ("gpipe", "1f1b")
    schedule = cls(stages[0] if one else stages, n_microbatches=microbatches, loss_fn=loss_fn)
    return mods, schedule, mesh


def _sizes(model: nn.Module) -> dict:
    if is_hf(model):
        return hf_sizes(model.config)
    cfg = model.cfg  # lesson 17's Llama
    return {"heads": cfg.heads, "kv_heads": cfg.kv_heads, "head_dim": cfg.hidden // cfg.heads}


def train_on_rank(model: nn.Module, dims, batches, microbatches: int, lr: float = 1e-2):
    """Train torch's composition of `model` (built alike on every rank) on the global
    `batches` [(ids, targets)] (targets shifted, -100 ignored); -> (this replica's loss per
    step on the last stage, else None; every parameter this rank's stages hold, whole,
    under the model's names). The loss of a step is the global batch's mean over its valid
    targets, as the model's own."""
    device = torch.device("cpu")
    replicas = dims.dp_replicate * dims.dp_shard
    tokens = [1.0]

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        total = F.cross_entropy(
            logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum"
        )
        # torch's schedule divides the gradients by the micro-batches, FSDP by the replicas
        return total * (microbatches * replicas / tokens[0])

    seq = batches[0][0].shape[1]
    mods, schedule, mesh = build(model, dims, loss_fn, microbatches, device, seq)
    params = [p for m in mods for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=lr)
    dp_rank = mesh["dp_replicate", "dp_shard"].get_coordinate()
    replica = dp_rank[0] * dims.dp_shard + dp_rank[1]
    first, last = any(m.first for m in mods), any(m.last for m in mods)
    losses = []
    for x, y in batches:
        tokens[0] = max(float((y != -100).sum()), 1.0)
        xb, yb = x.chunk(replicas)[replica], y.chunk(replicas)[replica]
        out: list[torch.Tensor] = []
        schedule.step(*((xb,) if first else ()), **({"target": yb, "losses": out} if last else {}))
        opt.step()
        opt.zero_grad()
        if last:  # this replica's share, times the replicas: their mean is the batch's loss
            share = float(torch.stack([o.detach() for o in out]).sum()) / microbatches
            losses.append(share)
    full = {}
    for mod in mods:
        for name, p in mod.named_parameters():
            whole = p.full_tensor() if hasattr(p, "full_tensor") else p
            full[name.removeprefix("model.")] = whole.detach().clone()
    return (losses if last else None), full
