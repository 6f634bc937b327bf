"""Lesson 17's composed engine trained with lesson 18's checkpoints: one rank's loop.

`train_rank(args, dims)` is `compose.fixture.run_rank` with a start and an end: it resumes
from `args.resume` when that holds a complete checkpoint, trains to step `args.steps` (the
total), saves every `args.save_every` steps and at the end into `args.save`, and (rank 0)
appends one JSON line per step to `args.log`.

What a checkpoint holds (`universal.save`, layout-free names): the engine's
`state_pieces()` (float32 master weights and Adam's states, every ZeRO chunk, expert shard,
tensor-parallel box and pipeline stage as rectangles of the one-process tensors), the step,
the data position as the *global* sample index (the fixture's batches are indexed by step:
resuming at `samples` trains on `batches[samples // global_batch:]`, whatever the dp
degree), and every rank's random streams (restored when the layout is the same; on another
layout a rank keeps its fresh streams: nothing in these models draws from them). The
engine has no loss scaler (bf16 needs none).

The log line: step, loss, seconds, tokens/s, model FLOP/s (6·Ψ·tokens, Ψ the parameters a
token meets: one expert of the MoE, top-1; Kaplan et al. 2020) and MFU against `peak`:
`--peak-flops` per rank when given, else this machine's fitted rate, a float32 matmul's
FLOP/s measured once on rank 0 (`matmul_flops`: a CPU's Python overhead on a model this
small keeps MFU far below 1), the memory each rank holds by kind and the ring bytes each
rank sent by group kind (`compose.fixture`'s `memory_by_kind`, `bytes_by_kind`).

`--die-at S --die-rank R [--die-once MARKER]`: rank R SIGKILLs itself after step S's save
(once: not again when MARKER exists), a dead rank for the notebook and the tests.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import time
from pathlib import Path

import torch

from .. import comm
from ..checkpoint_files import is_complete, recover
from ..compose.dims import Grid, ParallelDims
from ..compose.fixture import LR, SIZES, build, bytes_by_kind, memory_by_kind, one_step
from ..compose.parallelize import parallelize
from ..runtime.device import rank_device
from .state import TrainingState, capture_rng, restore_rng
from .universal import load, save


def layout_of(args, dims: dict) -> dict:
    """The record's `layout`: the dims, the precision and the model."""
    return {**dims, "model": args.model, "precision": args.precision, "layers": args.layers}


def active_parameters(model: torch.nn.Module) -> int:
    """Parameters a token meets: the dense ones, and one expert's per MoE layer (top-1)."""
    dense = expert = 0
    experts = set()
    for name, p in model.named_parameters():
        m = re.search(r"\.experts\.(\d+)\.", name)
        if m:
            experts.add(m.group(1))
            expert += p.numel()
        else:
            dense += p.numel()
    return dense + (expert // len(experts) if experts else 0)


def matmul_flops(n: int = 256, repeats: int = 8) -> float:
    """This machine's float32 matmul FLOP/s (one process, the median of `repeats`)."""
    a = torch.randn(n, n, device=rank_device())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ a
        times.append(time.perf_counter() - start)
    return 2 * n**3 / sorted(times)[len(times) // 2]


def _resume(args, engine, layout: dict):
    path = Path(args.resume) if args.resume else None
    if path is None or not (recover(path) or is_complete(path)):
        return TrainingState(), None
    report = load(path, engine.state_pieces(), layout)
    engine.finish_state_load()
    if report.state.samples % args.global_batch:
        raise ValueError(f"--resume {path}: its sample index {report.state.samples} is not a "
                         f"whole number of --global-batch={args.global_batch} batches")  # fmt: skip
    if report.rng_restored:
        restore_rng(report.state.rng, engine.module)
    return report.state, report


def _log(args, engine, grid, state, loss, seconds, ledger, psi, peak) -> None:
    tokens = args.global_batch * SIZES["seq_len"]
    mine = (memory_by_kind(engine), bytes_by_kind(ledger, grid))
    everyone = [None] * grid.dims.world_size
    comm.all_gather_object(everyone, mine, tag="log")
    if grid.rank != 0:
        return
    flops = 6 * psi * tokens / seconds
    line = {"step": state.step, "samples": state.samples, "loss": loss, "seconds": seconds,
            "tokens_per_s": tokens / seconds, "model_flops_per_s": flops,
            "mfu": flops / (peak * grid.dims.world_size), "peak_flops_per_rank": peak,
            "peak_from": "--peak-flops" if args.peak_flops else "matmul fitted here",
            "memory_per_rank": [m for m, _ in everyone],
            "bytes_per_rank": [b for _, b in everyone]}  # fmt: skip
    with open(args.log, "a") as f:
        f.write(json.dumps(line) + "\n")


def train_rank(args, dims: dict, progress=None) -> dict:
    """On every rank of a world of `dims`' size: resume, train to `args.steps`, save.
    `progress(start_step)`, when given, returns the per-step callback (loss, seconds)."""
    pdims = ParallelDims(**dims)
    model, batches = build(args.model, args.steps, args.global_batch, layers=args.layers)
    psi = active_parameters(model)
    grid = Grid(pdims)
    d = pdims.dp_replicate * pdims.dp_shard
    if args.global_batch % (d * args.micro_batch):
        raise ValueError(f"global_batch={args.global_batch} must divide by dp_replicate·"
                         f"dp_shard·micro_batch = {d}·{args.micro_batch}")  # fmt: skip
    engine = parallelize(model, pdims, grid=grid, precision=args.precision, lr=LR,
                         microbatches=args.global_batch // (d * args.micro_batch),
                         recompute=args.recompute)  # fmt: skip
    engine.measure_activations = True
    layout = layout_of(args, dims)
    state, report = _resume(args, engine, layout)
    resumed_from = state.step
    show = progress(resumed_from) if progress is not None else None
    peak = args.peak_flops or (matmul_flops() if args.log else 0.0)
    if args.log:  # rank 0's measure for everyone
        everyone = [None] * pdims.world_size
        comm.all_gather_object(everyone, peak, tag="log")
        peak = everyone[0]
    losses, times, ledgers = [], [], []
    while state.step < args.steps:
        x, y = batches[state.samples // args.global_batch]
        loss, seconds, ledger, _ = one_step(engine, grid, x, y)  # lesson 17's step
        losses.append(loss)
        times.append(seconds)
        ledgers.append(ledger)
        state = TrainingState(state.step + 1, state.samples + args.global_batch)
        if args.log:
            _log(args, engine, grid, state, losses[-1], times[-1], ledger, psi, peak)
        if show is not None:
            show(losses[-1], times[-1])
        due = args.save_every and state.step % args.save_every == 0
        if args.save and (due or state.step == args.steps):
            kept = TrainingState(state.step, state.samples, rng=capture_rng(engine.module))
            save(args.save, engine.state_pieces(), kept, layout)
        if args.die_at == state.step and grid.rank == args.die_rank:
            if not (args.die_once and os.path.exists(args.die_once)):
                if args.die_once:
                    Path(args.die_once).touch()
                os.kill(os.getpid(), signal.SIGKILL)
    params = engine.full_parameters()
    digest = hashlib.sha256()
    for name in sorted(params):
        digest.update(params[name].contiguous().numpy().tobytes())
    return {
        "losses": losses,
        "step": state.step,
        "resumed_from": resumed_from,
        "params": params,
        "optim": engine.full_optimizer_state(),
        "params_sha256": digest.hexdigest(),
        "bytes": bytes_by_kind(ledgers[-1], grid) if ledgers else {},
        "memory": memory_by_kind(engine),
        "step_s": sorted(times)[len(times) // 2] if times else float("nan"),
        "read": None if report is None else (report.bytes_read, report.shard_bytes),
    }
