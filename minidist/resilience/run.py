"""A training run that saves, dies, and resumes: `python -m minidist.resilience.run`.

Lesson 03's FSDP GPT (or lesson 02's ZeRO-1) trained on the fixture's global batches, with
lesson 18's checkpoints. The same command starts a run and resumes one:

    python -m minidist.resilience.run --world-size 2 --steps 8 --save DIR --save-every 2 \
        --resume DIR --log run.jsonl
    torchrun --standalone --nproc-per-node 2 --max-restarts 3 -m minidist.resilience.run ...

- `--steps N` is the total: a resumed run goes on from the checkpoint's step to N. The
  batch of a step is the one at the global sample index (`samples // global_batch`), so a
  resume on another dp degree or wrapper continues with the right data.
- `--resume DIR` loads DIR when it holds a complete checkpoint (else starts afresh): under
  torchrun's `--max-restarts`, a restarted world resumes from the last complete save and
  loses at most the steps since (`--save-every`; with `--async-save`, also a save still in
  flight when the rank died).
- `--log FILE` (rank 0) appends one JSON line per step: step, loss, seconds, tokens/s, model
  FLOP/s (6·Ψ per token, Kaplan et al. 2020) and MFU against `--peak-flops` when given,
  model-state bytes per rank, bytes sent per collective kind (the ledger's tags). Under
  torchrun spell it `--log-jsonl`: torchrun's own parser reads `--log` as ambiguous.
- The run ends with `name=value` lines: `step=`, `loss=` (repr: every bit), `resumed_from=`,
  `params_sha256=` (of the gathered parameters, to compare runs bit for bit).
- `--die-at S --die-rank R --die-once MARKER`: rank R SIGKILLs itself after step S unless
  MARKER exists (it creates it first): a dead rank for the tests.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from .. import comm
from ..checkpoint_files import is_complete, recover
from ..data import shard_batch
from ..data_parallel.fixture import build
from ..fsdp import FullyShardedDataParallel
from ..fsdp.fixture import UNITS, fsdp_state_bytes
from ..runtime import launch, under_torchrun
from ..zero import ZeroDataParallel
from ..zero.fixture import ADAM, zero_state_bytes
from .async_save import AsyncSaver
from .lesson_pieces import fsdp_pieces, materialize_optimizer_state, zero_pieces
from .state import TrainingState, capture_rng, restore_rng
from .universal import load, save


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m minidist.resilience.run")
    p.add_argument("--wrapper", choices=("fsdp", "zero1"), default="fsdp")
    p.add_argument("--world-size", type=int, default=2, help="ignored under torchrun")
    p.add_argument("--steps", type=int, default=8, help="total optimizer steps")
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--save", help="checkpoint directory to write")
    p.add_argument("--save-every", type=int, default=0, help="steps between saves")
    p.add_argument("--async-save", action="store_true")
    p.add_argument("--resume", help="checkpoint directory to resume from, if complete")
    p.add_argument("--log", "--log-jsonl", dest="log", help="JSONL file (rank 0 appends)")
    p.add_argument("--peak-flops", type=float, help="FLOP/s per rank the MFU is against")
    p.add_argument("--die-at", type=int)
    p.add_argument("--die-rank", type=int, default=0)
    p.add_argument("--die-once")
    args = p.parse_args(argv)
    for name in ("steps", "global_batch", "world_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    if args.save_every < 0 or (args.save_every and not args.save):
        p.error("--save-every needs --save DIR and must be >= 0")
    return args


def _wrap(kind: str):
    model, batches, loss_fn = build("gpt")
    if kind == "fsdp":
        fsdp = FullyShardedDataParallel(model, wrap=UNITS["gpt"])
        opt = torch.optim.Adam(fsdp.sharded_parameters(), **ADAM)
        return (fsdp, opt, lambda: fsdp_pieces(fsdp, opt), lambda: None,
                lambda: fsdp_state_bytes(fsdp, opt), loss_fn)  # fmt: skip
    zero = ZeroDataParallel(model, stage=1, bucket_cap_mb=1e-3, **ADAM)
    return (zero, zero.optimizer, lambda: zero_pieces(zero), zero.gather_parameters,
            lambda: zero_state_bytes(zero), loss_fn)  # fmt: skip


def train_on_rank(args: argparse.Namespace) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1000 + rank)  # per-rank streams (nothing draws from them here)
    model, opt, pieces, after_load, state_bytes, loss_fn = _wrap(args.wrapper)
    _, batches, _ = build("gpt", steps=args.steps, global_batch=args.global_batch)
    layout = {"wrapper": args.wrapper, "dp": world}
    state = TrainingState()
    if args.resume and (recover(Path(args.resume)) or is_complete(Path(args.resume))):
        materialize_optimizer_state(opt)
        report = load(args.resume, pieces(), layout)
        after_load()
        state = report.state
        if report.rng_restored:
            restore_rng(state.rng)
    resumed_from = state.step
    saver = AsyncSaver() if args.async_save else None
    dense = build("gpt").model
    psi = sum(p.numel() for p in dense.parameters() if p.requires_grad)
    tokens = args.global_batch * dense.cfg.seq_len
    loss = float("nan")
    while state.step < args.steps:
        x, y = shard_batch(batches[state.samples // args.global_batch], rank, world)
        start = time.perf_counter()
        with comm.record() as ledger:
            opt.zero_grad()
            local = loss_fn(model(x), y)
            local.backward()
            model.finish_gradient_sync()
            opt.step()
        total = local.detach().reshape(1) / world
        comm.all_reduce(total, tag="loss")  # the global batch's mean loss (equal slices)
        seconds = time.perf_counter() - start
        loss = total.item()
        state = TrainingState(state.step + 1, state.samples + args.global_batch)
        _log(args, state, loss, seconds, 6 * psi * tokens, tokens, state_bytes().total, ledger)
        due = args.save_every and state.step % args.save_every == 0
        if args.save and (due or state.step == args.steps):
            kept = TrainingState(state.step, state.samples, rng=capture_rng())
            if saver is not None:
                saver.save(args.save, pieces(), kept, layout)
            else:
                save(args.save, pieces(), kept, layout)
        if args.die_at == state.step and rank == args.die_rank and args.die_once:
            if not os.path.exists(args.die_once):
                Path(args.die_once).touch()
                os.kill(os.getpid(), signal.SIGKILL)
    if saver is not None:
        saver.close()
    full = model.full_parameters()
    digest = hashlib.sha256()
    for name in sorted(full):
        digest.update(full[name].detach().cpu().contiguous().numpy().tobytes())
    return {"step": state.step, "loss": loss, "resumed_from": resumed_from,
            "params_sha256": digest.hexdigest()}  # fmt: skip


def _log(args, state, loss, seconds, flops, tokens, nbytes, ledger) -> None:
    memory = [None] * dist.get_world_size()
    comm.all_gather_object(memory, nbytes, tag="log")
    if dist.get_rank() != 0 or not args.log:
        return
    kinds: dict[str, float] = {}
    for r in ledger.records:
        kind = re.sub(r"\d+", "", r.tag or r.op)
        kinds[kind] = kinds.get(kind, 0.0) + r.ring_bytes
    flops /= seconds
    line = {"step": state.step, "samples": state.samples, "loss": loss, "seconds": seconds,
            "tokens_per_s": tokens / seconds, "model_flops_per_s": flops,
            "mfu": flops / (args.peak_flops * dist.get_world_size()) if args.peak_flops else None,
            "memory_bytes_per_rank": memory, "bytes_by_kind": kinds}  # fmt: skip
    with open(args.log, "a") as f:
        f.write(json.dumps(line) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    results = launch(train_on_rank, None if under_torchrun() else args.world_size, args,
                     timeout_s=1800)  # fmt: skip
    if not under_torchrun() or int(os.environ["RANK"]) == 0:
        for key, value in results[0].items():
            print(f"{key}={value!r}" if isinstance(value, float) else f"{key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
