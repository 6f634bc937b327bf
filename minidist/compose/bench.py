"""`python -m minidist bench compose`: lesson 17's composed step against torch's own.

The same Llama-style model and layout on one world, timed in interleaved rounds
(`minidist.bench.interleaved_ab`): minidist's `parallelize` (ZeRO-1 over dp_shard × cp,
lesson 07's tensor and lesson 14's sequence parallelism from the plan, lesson 09's 1F1B)
against torch's (`compose.torch_native`: FSDP2's `fully_shard` over dp, DTensor TP/SP,
`torch.distributed.pipelining`'s `Schedule1F1B`). Torch 2.13 composes those three on gloo and
CPUs; it has no context parallelism on CPUs (`context_parallel` has no CPU rule) and no
expert parallelism, so the bench's layout has cp = ep = 1. Prints `ratio` (median over
rounds of minidist's step time over torch's; below 1 is faster), both times, the world's step
over one process's step of the same model and batch (`vs_one_process`, measured in the
parent on all its threads), and the MFU of both: 6·N·tokens FLOPs per step (Kaplan et al.
2020) over the machine's peak, a one-thread float32 matmul at the bench's sizes (a
micro-batch's tokens x hidden x hidden) times the cores the ranks share (`bench.peak_flops`).
"""

from __future__ import annotations

import copy
import statistics
import time

import torch

from ..bench import interleaved_ab, matmul_flops, peak_flops
from ..models import lm_loss
from ..registry import bench
from ..runtime import launch
from . import torch_native
from .dims import Grid, ParallelDims
from .fixture import build
from .parallelize import parallelize

GLOBAL_BATCH, MICRO_BATCH = 8, 1
HEADS = 4  # the fixture's Llama: 4 query heads, 2 K/V heads, ffn 2 x hidden


def bench_layout(world_size: int) -> dict:
    """dp_shard 2 · tp 2 (sp) · pp 2 on 8 ranks; without pp on 4; tp 2 (sp) on 2."""
    layouts = {
        8: dict(dp_shard=2, tp=2, sp=True, pp=2),
        4: dict(dp_shard=2, tp=2, sp=True),
        2: dict(tp=2, sp=True),
    }
    if world_size not in layouts:
        raise ValueError(f"bench compose: --world-size {world_size} must be 2, 4 or 8")
    return layouts[world_size]


def check_sizes(dims: dict, hidden: int | None, seq_len: int | None, layers: int | None):
    """Refuse, in the parent, sizes the bench's layout cannot split (one line each)."""
    if hidden is not None and hidden % (2 * HEADS):
        raise ValueError(
            f"--hidden {hidden} must be a multiple of {2 * HEADS} (the Llama's "
            f"{HEADS} heads of an even head_dim, for rotary)"
        )
    if seq_len is not None and seq_len % dims.get("tp", 1):
        raise ValueError(
            f"--seq-len {seq_len} must divide by tp={dims['tp']} (sequence parallelism splits it)"
        )
    if layers is not None and layers % dims.get("pp", 1):
        raise ValueError(f"--layers {layers} must divide by pp={dims['pp']}")


def _sizes(hidden, seq_len, layers) -> dict:
    given = dict(hidden=hidden, seq_len=seq_len, layers=layers)
    return {k: v for k, v in given.items() if v is not None}


def _on_rank(dims: dict, rounds: int, steps: int, sizes: dict) -> dict:
    pdims = ParallelDims(**dims)
    model, batches = build("llama", steps=1, global_batch=GLOBAL_BATCH, **sizes)
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

    mods, schedule, _ = torch_native.build(
        theirs, pdims, lm_loss, m, torch.device("cpu"), x.shape[1]
    )
    opt = torch.optim.Adam([p for mod in mods for p in mod.parameters()], lr=1e-2)
    first, last = any(mod.first for mod in mods), any(mod.last for mod in mods)

    def torchs():
        schedule.step(*((x,) if first else ()), **({"target": y} if last else {}))
        opt.step()
        opt.zero_grad()

    result = interleaved_ab(ours, torchs, rounds, steps)
    return {
        "ratio": result.ratio,
        "ours_s": sorted(result.seconds_a)[rounds // 2],
        "torch_s": sorted(result.seconds_b)[rounds // 2],
    }


def one_process_step(sizes: dict, rounds: int, steps: int) -> tuple[float, int, int]:
    """(the median seconds of one Adam step of the same model and global batch in this
    process, on all its threads; the model's parameters; the batch's tokens)."""
    model, batches = build("llama", steps=1, global_batch=GLOBAL_BATCH, **sizes)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = batches[0]
    times = []
    for _ in range(rounds + 1):  # the first round warms up
        start = time.perf_counter()
        for _ in range(steps):
            lm_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        times.append((time.perf_counter() - start) / steps)
    return statistics.median(times[1:]), sum(p.numel() for p in model.parameters()), x.numel()


@bench("compose")
def compose_bench(
    world_size: int,
    rounds: int,
    steps: int,
    hidden: int | None = None,
    seq_len: int | None = None,
    layers: int | None = None,
) -> dict:
    """lesson 17's composed step over torch's (FSDP2 x DTensor TP/SP x pipelining), Llama;
    --hidden --seq-len --layers size the model."""
    dims = bench_layout(world_size)
    check_sizes(dims, hidden, seq_len, layers)
    sizes = _sizes(hidden, seq_len, layers)
    alone_s, params, tokens = one_process_step(sizes, rounds, steps)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a rank's threads (one under fork)
    try:
        h = sizes.get("hidden", 32)
        per_core = matmul_flops(MICRO_BATCH * tokens // GLOBAL_BATCH, h, h)
    finally:
        torch.set_num_threads(threads)
    peak = peak_flops(per_core, world_size, threads=1)
    results = launch(_on_rank, world_size, dims, rounds, steps, sizes, timeout_s=900)
    slowest = max(results, key=lambda r: r["ratio"])
    label = ".".join(f"{k}{v}" if v is not True else k for k, v in dims.items())
    flops = 6 * params * tokens  # per step (Kaplan et al. 2020), the same for both sides
    return {
        "layout": label,
        "params": params,
        "tokens_per_step": tokens,
        "compose_step_s": slowest["ours_s"],
        "torch_step_s": slowest["torch_s"],
        "ratio": slowest["ratio"],
        "one_process_step_s": alone_s,
        "vs_one_process": slowest["ours_s"] / alone_s,
        "peak_flops": peak,
        "compose_mfu": flops / slowest["ours_s"] / peak,
        "torch_mfu": flops / slowest["torch_s"] / peak,
    }
