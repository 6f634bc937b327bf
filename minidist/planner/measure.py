"""Fit the planner's three machine numbers here, then time a layout and compare.

`fit_here(model, layout)`: the FLOP rate is what one process achieves on one rank's share of
the step (the same GPT, its forward, backward and optimizer step: on a small CPU model this
includes Python's per-operation overhead, which a datasheet's peak does not), the memory
bandwidth a large copy's, and α and the bandwidth of the links an all-reduce sweep's on a
world of `layout.world` ranks (lesson 00's `fit_alpha_beta`). `measured_step_seconds` times
the layout's real run with lesson 01's bucketed DDP (tp = pp = 1) or lesson 07's tensor
parallel GPT (tp > 1).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from ..data import shard_batch
from ..models import GPT, lm_loss
from ..registry import bench
from ..runtime import launch
from ..training import make_optimizer
from .hardware import Cluster, Device, fit_links_on_rank, measure_memory_bandwidth
from .spec import Layout, ModelSpec

WARMUP, STEPS = 3, 12


def _batch(model: ModelSpec, sequences: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, model.vocab, (sequences, model.seq + 1), device="cpu", generator=g)
    return idx[:, :-1], idx[:, 1:]


def _median_step(step) -> float:
    for _ in range(WARMUP):
        step()
    times = []
    for _ in range(STEPS):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _stepper(module, opt, x, y, loss_fn):
    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(module(x), y).backward()
        if hasattr(module, "finish_gradient_sync"):
            module.finish_gradient_sync()
        opt.step()

    return step


def single_process_seconds(model: ModelSpec, layout: Layout) -> float:
    """One process, one thread: a step of the whole model on one replica's sequences split
    t ways would be the rank's share; for tp > 1 the share is timed on the full model and
    divided by t (the tensor-parallel matmuls are t times smaller)."""
    torch.manual_seed(0)
    gpt = GPT(model.config())
    x, y = _batch(model, layout.global_batch // layout.dp)
    opt = make_optimizer(gpt.parameters())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _median_step(_stepper(gpt, opt, x, y, lm_loss)) / layout.tp
    finally:
        torch.set_num_threads(threads)


def fit_here(model: ModelSpec, layout: Layout) -> Cluster:
    """This machine as a `Cluster`: the fitted FLOP rate, memory bandwidth and links."""
    from .predict import flops_per_step

    flops = flops_per_step(model, layout) / single_process_seconds(model, layout)
    device = Device("this machine", flops, measure_memory_bandwidth(), float("inf"))
    link = launch(fit_links_on_rank, layout.world)[0]
    return Cluster(device, link, link, layout.world)


def _timed_on_rank(model: ModelSpec, layout: Layout) -> float:
    from ..data_parallel import BucketedDataParallel
    from ..megatron.layout import ParallelLayout
    from ..megatron.model import TensorParallelGPT

    torch.manual_seed(0)
    gpt = GPT(model.config())
    x, y = _batch(model, layout.global_batch)
    if layout.tp > 1:
        groups = ParallelLayout(tp=layout.tp)
        module = TensorParallelGPT(gpt, groups.group("tp"))
        opt = make_optimizer(module.parameters())
        return _median_step(_stepper(module, opt, x, y, module.loss))
    module = BucketedDataParallel(gpt)
    opt = make_optimizer(gpt.parameters())
    x, y = shard_batch((x, y), dist.get_rank(), dist.get_world_size())
    return _median_step(_stepper(module, opt, x, y, lm_loss))


def measured_step_seconds(model: ModelSpec, layout: Layout) -> float:
    """The slowest rank's median step time of `layout` run here (dp or tp alone)."""
    if layout.pp > 1 or (layout.tp > 1 and layout.dp > 1):
        raise ValueError(
            f"measured_step_seconds: times dp alone or tp alone, not dp={layout.dp}, "
            f"tp={layout.tp}, pp={layout.pp}"
        )
    return max(launch(_timed_on_rank, layout.world, model, layout))


BENCH_MODEL = ModelSpec(layers=2, hidden=128, heads=4, vocab=64, seq=64)


@bench("plan")
def bench_plan(world_size: int, rounds: int, steps: int) -> dict[str, float]:
    """Measured over predicted step time, for data parallelism and for tensor parallelism on
    `world_size` ranks, with the machine fitted first (`fit_here`). A ratio near 1 says the
    α-β + roofline model explains the step; the notebook discusses what it leaves out."""
    from .plan import plan

    out = {}
    for kind, layout in (
        ("dp", Layout(dp=world_size, optimizer="sgd", global_batch=8 * world_size)),
        ("tp", Layout(tp=world_size, optimizer="sgd", global_batch=8)),
    ):
        predicted = plan(BENCH_MODEL, layout, fit_here(BENCH_MODEL, layout)).time.total_s
        measured = measured_step_seconds(BENCH_MODEL, layout)
        out[f"{kind}_step_time_predicted_s"] = predicted
        out[f"{kind}_step_time_measured_s"] = measured
        out[f"{kind}_measured_over_predicted"] = measured / predicted
    return out
