"""The rank functions lesson 04's notebook, tests and tour share.

Lesson 01's GPT (`minidist.data_parallel.fixture.build`: a tied and a frozen parameter)
trained with lesson 02's Adam, so that `minidist.zero.fixture.reference` is the fp32
single-process reference.

- `train_on_rank`: lesson 03's FSDP with `MixedPrecision(param_dtype)` and a
  `DynamicLossScaler` (or none), optionally with overflows injected on one rank.
- `reference_losses`: the fp32 single-process losses for any number of steps.
- `grad_scaler_scales`: `torch.amp.GradScaler`'s sequence of scales for an overflow pattern,
  the reference the scaler is compared with.
- `gradient_magnitudes`: the GPT's gradients of one step (weights, and activations between
  layers), measured in fp32 in one process: where they fall on fp16's number line.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import comm
from ..data import shard_batch
from ..data_parallel.fixture import STEPS, build
from ..fsdp.fixture import UNITS
from ..fsdp.fully_sharded import FullyShardedDataParallel
from ..policy import MixedPrecision
from ..training import train
from ..zero.fixture import ADAM
from .scaler import DynamicLossScaler


def train_on_rank(
    param_dtype: torch.dtype,
    overflow_steps: tuple[int, ...] = (),
    steps: int = STEPS,
    loss_scaling: bool = True,
    **scaler_args,
) -> dict:
    """FSDP with `MixedPrecision(param_dtype)` and a loss scaler (unless `loss_scaling` is
    False: bf16 needs none); at `overflow_steps` the last rank's gradient is made inf after
    backward (an injected overflow, in its own shard only).

    Returns a dict of per-step lists: losses (this rank's slice), scales (after update),
    params (full, after the step), states (Adam state snapshots), stepped, local_inf (did
    this rank's own shard hold an inf or NaN, before the ranks agreed); all_gather_bytes
    (payload of the parameter all-gathers) and found_inf_sent (bytes each of the scaler's
    all-reduces sent).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    # one thread: the order of a matrix product's sums (and so the last bits of an fp16
    # gradient, and whether a step at the edge overflows) does not depend on the machine
    torch.set_num_threads(1)
    model, batches, loss_fn = build("gpt", steps=steps)
    scaler = DynamicLossScaler(**scaler_args) if loss_scaling else None
    policy = MixedPrecision(param_dtype, loss_scaler=scaler)
    fsdp = FullyShardedDataParallel(model, wrap=UNITS["gpt"], mixed_precision=policy)
    opt = torch.optim.Adam(fsdp.sharded_parameters(), **ADAM)
    out = dict(losses=[], scales=[], params=[], states=[], stepped=[], local_inf=[])
    with comm.record() as ledger:
        for step, batch in enumerate(batches):
            x, y = shard_batch(batch, rank, world)
            opt.zero_grad()
            loss = loss_fn(fsdp(x), y)
            (scaler.scale(loss) if scaler else loss).backward()
            if step in overflow_steps and rank == world - 1:
                fsdp.sharded_parameters()[0].grad[0] = float("inf")
            grads = [p.grad for p in fsdp.sharded_parameters() if p.grad is not None]
            out["local_inf"].append(any(bool((~torch.isfinite(g)).any()) for g in grads))
            if scaler:
                out["stepped"].append(scaler.step(opt))
                scaler.update()
                out["scales"].append(scaler.get_scale())
            else:
                opt.step()
                out["stepped"].append(True)
            out["losses"].append(loss.item())
            out["params"].append(fsdp.full_parameters())
            out["states"].append([{k: v.clone() for k, v in s.items()} for s in opt.state.values()])
    out["all_gather_bytes"] = sum(
        r.payload_bytes for r in ledger.records if r.op == "all_gather" and r.tag != "full-state"
    )
    out["found_inf_sent"] = [r.ring_bytes for r in ledger.records if r.tag == "found-inf"]
    return out


def reference_losses(steps: int = STEPS) -> list[float]:
    """The losses of the same GPT trained with the same Adam in fp32 in one process."""
    model, batches, loss_fn = build("gpt", steps=steps)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], **ADAM)
    return train(model, batches, loss_fn, opt).losses


def grad_scaler_scales(steps: int, overflow_steps=(), **scaler_args) -> list[float]:
    """`torch.amp.GradScaler("cpu")`'s scale after each of `steps` steps when the gradient
    overflows at `overflow_steps` (GradScaler's defaults unless `scaler_args` says)."""
    scaler = torch.amp.GradScaler("cpu", **scaler_args)
    p = nn.Parameter(torch.ones(2, device="cpu"))
    opt = torch.optim.SGD([p], lr=0.1)
    scales = []
    for step in range(steps):
        opt.zero_grad()
        scaler.scale(p.sum()).backward()
        if step in overflow_steps:
            p.grad[0] = float("inf")
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales


def gradient_magnitudes(step: int = 0) -> dict[str, torch.Tensor]:
    """|gradient| of every element after one fp32 backward of the GPT on the whole batch of
    `step`, in one process: "weights" (the parameters' gradients) and "activations" (the
    gradients flowing between layers: the outputs of every Linear and LayerNorm)."""
    model, batches, loss_fn = build("gpt")
    acts: list[torch.Tensor] = []

    def keep(module, grad_in, grad_out):
        acts.extend(g.detach().abs().flatten() for g in grad_out if g is not None)

    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.LayerNorm)):
            m.register_full_backward_hook(keep)
    x, y = batches[step]
    loss_fn(model(x), y).backward()
    weights = [p.grad.abs().flatten() for p in model.parameters() if p.grad is not None]
    return {"weights": torch.cat(weights), "activations": torch.cat(acts)}


def low_precision_grads(dtype: torch.dtype, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """The GPT's parameter gradients of the first batch when the whole model computes in
    `dtype` (one process, loss in fp32), backward from loss · `scale`, unscaled in fp32."""
    model, batches, loss_fn = build("gpt")
    model = model.to(dtype)
    x, y = batches[0]
    (loss_fn(model(x).float(), y) * scale).backward()
    return {n: p.grad.float() / scale for n, p in model.named_parameters() if p.grad is not None}
