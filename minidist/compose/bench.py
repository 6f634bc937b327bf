"""`python -m minidist bench compose`: lesson 17's composed step against torch's own.

The same Llama-style model and layout on one world, timed in interleaved rounds
(`minidist.bench.interleaved_ab`): minidist's `parallelize` (ZeRO-1 over dp_shard × cp,
lesson 07's tensor and lesson 14's sequence parallelism from the plan, lesson 09's 1F1B)
against torch's (`compose.torch_native`: FSDP2's `fully_shard` over dp, DTensor TP/SP,
`torch.distributed.pipelining`'s `Schedule1F1B`). Torch 2.13 composes those three on gloo and
CPUs; it has no context parallelism on CPUs (`context_parallel` has no CPU rule) and no
expert parallelism, so the bench's layout has cp = ep = 1. Prints `ratio` (median over
rounds of minidist's step time over torch's; below 1 is faster) and both times.
"""

from __future__ import annotations

import copy

import torch

from ..bench import interleaved_ab
from ..models import lm_loss
from ..registry import bench
from ..runtime import launch
from . import torch_native
from .dims import Grid, ParallelDims
from .fixture import build
from .parallelize import parallelize

GLOBAL_BATCH, MICRO_BATCH = 8, 1


def bench_layout(world_size: int) -> dict:
    """dp_shard 2 · tp 2 (sp) · pp 2 on 8 ranks; without pp on 4; tp 2 (sp) on 2."""
    layouts = {8: dict(dp_shard=2, tp=2, sp=True, pp=2), 4: dict(dp_shard=2, tp=2, sp=True),
               2: dict(tp=2, sp=True)}  # fmt: skip
    if world_size not in layouts:
        raise ValueError(f"bench compose: --world-size {world_size} must be 2, 4 or 8")
    return layouts[world_size]


def _on_rank(dims: dict, rounds: int, steps: int) -> dict:
    pdims = ParallelDims(**dims)
    model, batches = build("llama", steps=1, global_batch=GLOBAL_BATCH)
    theirs = copy.deepcopy(model)
    grid = Grid(pdims)
    d = pdims.dp_replicate * pdims.dp_shard
    m = GLOBAL_BATCH // (d * MICRO_BATCH)
    engine = parallelize(model, pdims, grid=grid, microbatches=m)
    replica = grid.coord["dp_replicate"] * pdims.dp_shard + grid.coord["dp_shard"]
    x, y = (t.chunk(d)[replica] for t in batches[0])

    def ours():
        engine.zero_grad()
        engine.train_step((x, y))
        engine.finish_gradient_sync()
        engine.step()

    mods, schedule, _ = torch_native.build(theirs, pdims, lm_loss, m, torch.device("cpu"),
                                           x.shape[1])  # fmt: skip
    opt = torch.optim.Adam([p for mod in mods for p in mod.parameters()], lr=1e-2)
    first, last = any(mod.first for mod in mods), any(mod.last for mod in mods)

    def torchs():
        schedule.step(*((x,) if first else ()), **({"target": y} if last else {}))
        opt.step()
        opt.zero_grad()

    result = interleaved_ab(ours, torchs, rounds, steps)
    return {"ratio": result.ratio, "ours_s": sorted(result.seconds_a)[rounds // 2],
            "torch_s": sorted(result.seconds_b)[rounds // 2]}  # fmt: skip


@bench("compose")
def compose_bench(world_size: int, rounds: int, steps: int) -> dict:
    """lesson 17's composed step over torch's (FSDP2 x DTensor TP/SP x pipelining), Llama."""
    dims = bench_layout(world_size)
    results = launch(_on_rank, world_size, dims, rounds, steps, timeout_s=900)
    slowest = max(results, key=lambda r: r["ratio"])
    label = ".".join(f"{k}{v}" if v is not True else k for k, v in dims.items())
    return {"layout": label, "compose_step_s": slowest["ours_s"],
            "torch_step_s": slowest["torch_s"], "ratio": slowest["ratio"]}  # fmt: skip
