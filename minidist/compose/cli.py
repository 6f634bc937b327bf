"""`python -m minidist train`: one composed layout on a local world, or on torchrun's.

    python -m minidist train --model llama --dp-shard 2 --tp 2 --sp --pp 2 --compare
    torchrun --nproc-per-node 16 -m minidist train --dp-shard 2 --tp 2 --pp 2 --cp 2 ...

The world is the product of the sizes given (a size not given is 1). Rank 0 shows a
progress line (loss, tokens/s); at the end the parent prints `name=value` lines: the last
loss, the median step time, tokens/s, the ring bytes each group kind carried in the last
step (`bytes_dp`, `bytes_tp`, `bytes_pp`, `bytes_cp`, `bytes_ep`: the largest over the
ranks) and what a rank holds by kind (`memory_params`, `memory_grads`, `memory_master`,
`memory_optimizer`, `memory_activations`: the largest over the ranks); with `--compare`
also the one-process run's differences, `loss_max_abs_diff` and `params_max_abs_diff`.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch.distributed as dist

from .dims import SCHEDULES, ParallelDims
from .fixture import MODELS, SIZES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", choices=MODELS, default="gpt")
    for name in ("dp-replicate", "dp-shard", "tp", "pp", "cp", "ep"):
        p.add_argument(f"--{name}", type=int, default=1)
    p.add_argument("--sp", action="store_true", help="sequence parallelism inside tp")
    p.add_argument("--schedule", choices=SCHEDULES, default="1f1b")
    p.add_argument("--virtual", type=int, default=1, help="chunks per rank (interleaved)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--recompute", action="store_true")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--compare", action="store_true", help="also train in one process")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole run")


def _progress(steps: int, tokens: int):
    done = []

    def show(loss: float, seconds: float, eval_loss: float | None = None) -> None:
        done.append(seconds)
        if dist.get_rank() == 0:
            bar = "#" * (20 * len(done) // steps)
            rate = f"{tokens / seconds:,.0f} tokens/s"
            held = "" if eval_loss is None else f" eval {eval_loss:.4f}"
            eta = f" ETA {sorted(done)[len(done) // 2] * (steps - len(done)):.0f}s"
            line = f"\r[{bar:<20}] step {len(done)}/{steps} loss {loss:.4f}{held} {rate}{eta}"
            print(line, end="", file=sys.stderr, flush=True)
            if len(done) == steps:
                print(file=sys.stderr)

    return show


def _rank(args: argparse.Namespace, dims: dict) -> dict:
    from .fixture import run_rank

    tokens = args.global_batch * SIZES["seq_len"]
    return run_rank(args.model, dims, args.steps, args.global_batch, args.micro_batch,
                    args.precision, args.recompute, measure=True,
                    progress=_progress(args.steps, tokens))  # fmt: skip


def _planned(args: argparse.Namespace, dims: dict) -> dict:
    """`compose.theory.planned` for this run: the most any rank holds and sends, by kind
    (the experts' all-to-all depends on the routing and the activations on the schedule's
    walk: measured only)."""
    from .fixture import build
    from .theory import planned

    model, _ = build(args.model)
    return planned(model, ParallelDims(**dims), args.global_batch, args.micro_batch,
                   args.precision, args.recompute)  # fmt: skip


def run_train(args: argparse.Namespace) -> int:
    import minidist

    dims = dict(dp_replicate=args.dp_replicate, dp_shard=args.dp_shard, cp=args.cp,
                tp=args.tp, sp=args.sp, pp=args.pp, schedule=args.schedule,
                virtual=args.virtual, ep=args.ep)  # fmt: skip
    world = ParallelDims(**dims).world_size  # bad sizes refused here, before any world
    results = minidist.launch(_rank, world, args, dims, timeout_s=args.timeout)
    if minidist.under_torchrun() and int(os.environ.get("RANK", "0")) != 0:
        return 0  # under torchrun every rank has every result: rank 0 reports
    first, tokens = results[0], args.global_batch * SIZES["seq_len"]
    lines = {"world_size": world, "step": args.steps, "loss": first["losses"][-1],
             "step_s": first["step_s"],
             "tokens_per_s": tokens / first["step_s"]}  # fmt: skip
    plan = _planned(args, dims)
    for what in ("bytes", "memory"):  # each measured figure, its plan beside it
        for kind in first[what]:
            lines[f"{what}_{kind}"] = max(r[what][kind] for r in results)
            if kind in plan[what]:
                lines[f"planned_{what}_{kind}"] = plan[what][kind]
    if args.compare:
        from ..training import max_abs_diff
        from .fixture import reference

        ref = reference(args.model, args.steps, args.global_batch)
        diffs = [abs(a - b) for a, b in zip(first["losses"], ref["losses"])]
        lines["loss_max_abs_diff"] = max(diffs)
        lines["params_max_abs_diff"] = max_abs_diff(first["params"], ref["params"])
    for name, value in lines.items():
        print(f"{name}={value!r}" if name == "loss" else  # every bit of the loss
              f"{name}={value:.6g}" if isinstance(value, float) else f"{name}={value}")  # fmt: skip
    return 0
