"""Torch's own composition of the same layout, the other side of `bench compose`.

What torch 2.13 composes on gloo and CPUs (checked by `tests/test_compose_torch_native.py`
against one process): FSDP2's `fully_shard` over the dp mesh dimension (a 2-D
(dp_replicate, dp_shard) mesh for HSDP), DTensor tensor parallelism with sequence parallelism
(`parallelize_module` with torchtitan's Llama plan: `ColwiseParallel`, `RowwiseParallel`,
`SequenceParallel`, `PrepareModuleInput(Shard(1) -> Replicate())`), and
`torch.distributed.pipelining`'s `PipelineStage` with GPipe, 1F1B, interleaved 1F1B and
ZB-V, on one `init_device_mesh("cpu", ...)`. What it does not: `context_parallel`
(`torch.distributed.tensor.experimental`) dispatches SDPA to CUDA-only ring kernels and has
no CPU rule, so cp = 1 here; and expert parallelism has no torch-native module.

The model is any Hugging Face-layout Llama (`model.embed_tokens`, `model.layers`,
`model.norm`, `lm_head`; `minidist.models_llama` or a user's), cut into stages whole blocks
at a time as torchtitan's `pipeline_module_split` does.
"""

from __future__ import annotations

import torch
import torch.nn as nn

SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
             "interleaved": "ScheduleInterleaved1F1B", "zb-v": "ScheduleZBVZeroBubble"}  # fmt: skip


class LlamaStage(nn.Module):
    """Blocks `lo:hi` of an HF-layout Llama, with the embedding first and the head last."""

    def __init__(self, model: nn.Module, lo: int, hi: int):
        super().__init__()
        n = len(model.model.layers)
        self.embed = model.model.embed_tokens if lo == 0 else None
        self.layers = nn.ModuleList(model.model.layers[lo:hi])
        self.norm = model.model.norm if hi == n else None
        self.lm_head = model.lm_head if hi == n else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        if self.lm_head is not None:
            x = self.lm_head(self.norm(x))
        return x


def stage_indices(pp: int, chunks: int, schedule: str, pp_rank: int) -> list[int]:
    """The virtual stages a pp rank runs: round-robin (interleaved), V-shaped (ZB-V)."""
    if schedule == "zb-v":
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + c * pp for c in range(chunks)]


def tensor_parallel(stage: LlamaStage, mesh, sequence_parallel: bool) -> None:
    """torchtitan's Llama plan on one stage (`parallelize_llama`'s `apply_tp`)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    seq = Shard(1) if sequence_parallel else Replicate()

    def enter():
        return PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),),
                                  use_local_output=True)  # fmt: skip

    for layer in stage.layers:
        plan = {
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=seq),
            "mlp.down_proj": RowwiseParallel(output_layouts=seq),
        }  # fmt: skip
        if sequence_parallel:
            norms = {"input_layernorm": SequenceParallel(), "self_attn": enter()}
            norms.update({"post_attention_layernorm": SequenceParallel(), "mlp": enter()})
            plan.update(norms)
        parallelize_module(layer, mesh, plan)
    top = {}
    if stage.embed is not None:
        top["embed"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if stage.lm_head is not None:
        if sequence_parallel:
            top["norm"] = SequenceParallel()
        top["lm_head"] = enter()
    if top:
        parallelize_module(stage, mesh, top)


def build(model: nn.Module, dims, loss_fn, microbatches: int, device: torch.device):
    """(stage modules of this rank, torch's schedule) for `dims` (a `ParallelDims`-like object:
    dp_replicate, dp_shard, tp, sp, pp, schedule, virtual; cp must be 1) on this rank."""
    import torch.distributed.pipelining as pipelining
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if getattr(dims, "cp", 1) != 1 or getattr(dims, "ep", 1) != 1:
        raise ValueError("torch_native.build: torch 2.13 composes no context parallelism on "
                         "CPUs and has no expert parallelism: cp and ep must be 1")  # fmt: skip
    if dims.schedule not in SCHEDULES:
        raise ValueError(f"torch_native.build: schedule={dims.schedule!r} is not one of "
                         f"{tuple(SCHEDULES)}")  # fmt: skip
    shape = (dims.pp, dims.dp_replicate, dims.dp_shard, dims.tp)
    mesh = init_device_mesh(
        device.type, shape, mesh_dim_names=("pp", "dp_replicate", "dp_shard", "tp")
    )
    chunks = 2 if dims.schedule == "zb-v" else dims.virtual
    n, virtual = len(model.model.layers), dims.pp * chunks
    mods, stages = [], []
    for s in stage_indices(dims.pp, chunks, dims.schedule, mesh["pp"].get_local_rank()):
        mod = LlamaStage(model, s * n // virtual, (s + 1) * n // virtual)
        if dims.tp > 1:
            tensor_parallel(mod, mesh["tp"], dims.sp)
        if dims.dp_replicate * dims.dp_shard > 1:
            dp = mesh["dp_replicate", "dp_shard"]
            for layer in mod.layers:
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


def global_name(mod: LlamaStage, name: str, lo: int) -> str:
    """A stage parameter's name in the whole HF-layout model."""
    head, _, rest = name.partition(".")
    if head == "layers":
        i, _, rest = rest.partition(".")
        return f"model.layers.{lo + int(i)}.{rest}"
    return {"embed": "model.embed_tokens", "norm": "model.norm"}.get(head, head) + "." + rest


def train_on_rank(model: nn.Module, dims, batches, microbatches: int, lr: float = 1e-2):
    """Train torch's composition of `model` (built alike on every rank) on the global
    `batches` [(x, y)]; -> (this replica's mean loss per step on the last stage, else None;
    every parameter this rank's stages hold, whole, under the model's names)."""
    from ..models import lm_loss

    device = torch.device("cpu")
    n = len(model.model.layers)
    mods, schedule, mesh = build(model, dims, lm_loss, microbatches, device)
    params = [p for m in mods for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=lr)
    dp_rank = mesh["dp_replicate", "dp_shard"].get_coordinate()
    replica = dp_rank[0] * dims.dp_shard + dp_rank[1]
    replicas = dims.dp_replicate * dims.dp_shard
    first = any(m.embed is not None for m in mods)
    last = any(m.lm_head is not None for m in mods)
    losses = []
    for x, y in batches:
        xb, yb = x.chunk(replicas)[replica], y.chunk(replicas)[replica]
        out: list[torch.Tensor] = []
        schedule.step(*((xb,) if first else ()), **({"target": yb, "losses": out} if last else {}))
        opt.step()
        opt.zero_grad()
        if last:
            losses.append(float(torch.stack([o.detach() for o in out]).mean()))
    full = {}
    chunks = 2 if dims.schedule == "zb-v" else dims.virtual
    indices = stage_indices(dims.pp, chunks, dims.schedule, mesh["pp"].get_local_rank())
    for mod, s in zip(mods, indices):
        lo = s * n // (dims.pp * chunks)
        for name, p in mod.named_parameters():
            whole = p.full_tensor() if hasattr(p, "full_tensor") else p
            full[global_name(mod, name, lo)] = whole.detach().clone()
    return (losses if last else None), full
