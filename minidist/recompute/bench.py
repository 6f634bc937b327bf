"""`python -m minidist bench memory`: what each way of fitting more costs, on one world.

For the course GPT (4 blocks) on a world of N ranks, one row per combination: plain DP
(lesson 01), ZeRO-1/2 (lesson 02), FSDP = ZeRO-3 (lesson 03), then FSDP with bf16 mixed
precision (lesson 04), with the optimizer offloaded to the host (lesson 05), with every
block recomputed (lesson 06). Each row gives the bytes a rank keeps per kind (model states
after a step, counted per storage by `minidist.memory`; activations saved during forward),
the step's approximate peak on the device (model states plus the most activation bytes held
at once during the step, `LiveActivations`: what forward saved, except with recomputation,
where backward adds one block's activations while it recomputes it), and the median step
time. With offload the optimizer's bytes are on the host (`host_kib`).
On a GPU the row also reports `torch.cuda.max_memory_allocated`.

The trade-off a user chooses from: every row trains the same model to the same result (the
tests prove it per technique); they differ in bytes and seconds.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from .. import comm
from ..data import shard_batch
from ..data_parallel import BucketedDataParallel
from ..data_parallel.fixture import build
from ..fsdp.fixture import UNITS
from ..fsdp.fully_sharded import FullyShardedDataParallel
from ..memory import cuda_peak_bytes, model_state_bytes
from ..mixed_precision import MixedPrecision
from ..offload import OffloadOptimizer
from ..registry import bench
from ..runtime import launch
from ..zero import ZeroDataParallel
from ..zero.fixture import ADAM
from .checkpoint import recompute
from .measure import LiveActivations

MODEL = dict(layers=4, hidden=64, heads=4, seq_len=32, global_batch=16)
SETUPS = (
    "DP",
    "ZeRO-1",
    "ZeRO-2",
    "ZeRO-3 (FSDP)",
    "FSDP + bf16",
    "FSDP + bf16 + offload",
    "FSDP + bf16 + offload + recompute",
)


def _setup(name: str, model):
    """(wrapped model, optimizer, extra tensors to count as parameters, as gradients)."""
    bf16 = MixedPrecision(torch.bfloat16) if "bf16" in name else None
    if name == "DP":
        ddp = BucketedDataParallel(model)
        opt = torch.optim.Adam(model.parameters(), **ADAM)
        return ddp, opt, [], lambda: [b.buffer for b in ddp.buckets]
    if name.startswith("ZeRO-") and "FSDP" not in name:
        zero = ZeroDataParallel(model, stage=int(name[-1]), **ADAM)
        return (
            zero,
            zero.optimizer,
            zero.shards,
            lambda: [t for b in zero.buckets for t in (b.flat_grad, b.grad_chunk) if t is not None],
        )
    if "recompute" in name:
        for block in model.blocks:
            recompute(block, use_reentrant=True)  # the lesson's form, as its fixture
    fsdp = FullyShardedDataParallel(model, wrap=UNITS["gpt"], mixed_precision=bf16)
    if "offload" in name:
        opt = OffloadOptimizer(fsdp.sharded_parameters(), **ADAM)
    else:
        opt = torch.optim.Adam(fsdp.sharded_parameters(), **ADAM)
    return (
        fsdp,
        opt,
        [u.full for u in fsdp.units],
        lambda: [s.grad for s in fsdp.shards if s.grad is not None],
    )


def _bench_rank(name: str, steps: int) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build("gpt", steps=steps + 1, **MODEL)
    wrapped, opt, extra_params, grads = _setup(name, model)
    local = [shard_batch(b, rank, world) for b in batches]
    times, activations, peak = [], 0, 0
    flat = [u.full for u in getattr(wrapped, "units", [])]
    for i, (x, y) in enumerate(local):
        comm.barrier(tag="timing")
        t0 = time.perf_counter()
        opt.zero_grad()
        with LiveActivations(model, exclude=flat) as live:  # forward and backward
            loss = loss_fn(wrapped(x), y)
            saved = live.live  # what forward saved (SavedActivations would count the same)
            loss.backward()
        wrapped.finish_gradient_sync()
        opt.step()
        if i > 0:  # the first step warms up
            times.append(time.perf_counter() - t0)
        activations = max(activations, saved)
        peak = max(peak, live.peak)
    offloaded = isinstance(opt, OffloadOptimizer)  # its state is on the host, not here
    states = model_state_bytes(
        wrapped, None if offloaded else opt, extra_params=extra_params, extra_grads=grads()
    )
    return {
        "host": opt.resident_bytes()["host"] if offloaded else 0,
        "params": states.params,
        "grads": states.grads,
        "optimizer": states.optimizer,
        "activations": activations,
        "activation_peak": peak,
        "ms": 1e3 * statistics.median(times),
        "cuda_peak": cuda_peak_bytes(),
    }


@bench("memory")
def bench_memory(world_size: int, rounds: int, steps: int) -> dict[str, float]:
    """Bytes per rank and step time of each combination; `rounds` is unused (one run each)."""
    out: dict[str, float] = {"world_size": world_size}
    for name in SETUPS:
        r = launch(_bench_rank, world_size, name, max(steps, 2), timeout_s=600)[0]
        key = name.lower().replace(" + ", "_").replace(" ", "_").replace("(", "").replace(")", "")
        states = r["params"] + r["grads"] + r["optimizer"]
        out[f"{key}_state_kib"] = states / 1024
        out[f"{key}_activation_kib"] = r["activations"] / 1024
        out[f"{key}_peak_kib"] = (states + r["activation_peak"]) / 1024
        out[f"{key}_step_ms"] = r["ms"]
        if r["host"]:
            out[f"{key}_host_kib"] = r["host"] / 1024
        if r["cuda_peak"] is not None:
            out[f"{key}_cuda_peak_kib"] = r["cuda_peak"] / 1024
    return out
