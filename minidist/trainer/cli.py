"""`python -m minidist train`: one composed layout on a local world, or on torchrun's.

    python -m minidist train --model llama --dp-shard 2 --tp 2 --sp --pp 2 --compare
    python -m minidist train --model llama --hidden 256 --heads 8 --kv-heads 4 --layers 6 \\
        --seq-len 128 --data notes/ --optimizer adamw --lr 3e-3 --weight-decay 0.1 \\
        --warmup 20 --lr-schedule cosine --min-lr 3e-4 --clip-grad 1.0 --eval-every 50 \\
        --dp-shard 2 --tp 2 --steps 400 --save ck --save-every 100 --log run.jsonl
    python -m minidist train --config run.toml --resume ck --dp-shard 4 --tp 1
    torchrun --nproc-per-node 4 --max-restarts 3 -m minidist train --dp-shard 2 --tp 2 \\
        --steps 12 --save ck --save-every 2 --resume ck --log-jsonl run.jsonl

- The world is the product of the sizes given (a size not given is 1). Bad options are
  refused in the parent, before any rank starts: one line naming the option and the rule,
  exit status 2. The resolved configuration is printed (TOML) and, with `--save DIR`,
  saved beside the checkpoint as `DIR.config.toml` (`--config` of it repeats the run).
- `--steps N` is the total: a resumed run goes on from the checkpoint's step to N.
- `--keep-last N` (N >= 1): each save goes into `DIR/step_<8 digits>` (written as any save:
  staged, checksums last, renamed into place), then rank 0 removes this run's older saves
  beyond the newest N: complete `step_<digits>` folders in DIR, nothing else. DIR must not be
  a checkpoint itself, nor hold step_ checkpoints unless resumed from (`--resume DIR`).
- `--resume DIR` loads DIR when it holds a complete checkpoint, else its newest complete
  `step_<digits>` checkpoint (one half-written is passed over; else it starts afresh), on any
  layout (refused, naming both, when it was saved by another model or on other data, or
  cannot serve this layout); under torchrun's `--max-restarts` a restarted world resumes
  from the last complete save and loses at most `--save-every` steps.
- `--log FILE` (rank 0 appends JSON lines, `loop.py`). Under torchrun spell it
  `--log-jsonl`: torchrun's parser sees every argument, and reads `--log` as an ambiguous
  prefix of its own `--log-dir`, `--log-line-prefix-template`, ...
- Rank 0 shows a progress line (loss, eval loss, tokens/s, ETA). The run ends with
  `name=value` lines: `step=`, `loss=` and `eval_loss=` (repr: every bit), `resumed_from=`,
  `params_sha256=` (to compare runs bit for bit), the median step time, tokens/s, the ring
  bytes each group kind carried in the last step and what a rank holds by kind (the
  largest over the ranks, `bytes_*`, `memory_*`) with lesson 17's plan beside them
  (`planned_*`, built-in models; `python -m minidist plan` prints them without training;
  the MoE's all-to-all follows its routing: `planned_bytes_ep_bound=`, what no routing
  exceeds), `read_bytes_max=` and `shard_bytes_max=` on a resume, and with `--compare`
  the one-process run's differences (`loss_max_abs_diff`, `params_max_abs_diff`).
- A rank that fails ends the run: the rank that failed first, and its traceback, in a
  message on stderr, exit status 1. So does a hang: every rank idle (waiting in collectives)
  for `--idle-timeout` seconds (default 300), with where each rank waited.
- A dead rank for lesson 18's demonstration: `--die-at S --die-rank R [--die-once MARKER]`,
  rank R SIGKILLs itself after step S's save (once: not again when MARKER exists); the loop
  knows nothing of it (`kill_rank_after`, a callback).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from pathlib import Path

import torch.distributed as dist

from .. import comm
from ..cli_checks import positive_int
from ..compose.dims import SCHEDULES, ParallelDims
from ..compose.fixture import MODELS
from ..compose.fsdp import MODES as DP_SHARD_MODES
from . import options
from .checks import check, check_run, dims_of  # noqa: F401 (the CLI's and `plan`'s)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        type=model_name,
        default="gpt",
        help=f"a built-in model {MODELS}, or package.module:function returning a "
        "transformers causal LM",
    )
    for name in ("dp-replicate", "dp-shard", "tp", "pp", "cp", "ep"):
        p.add_argument(f"--{name}", type=int, default=1)
    p.add_argument("--sp", action="store_true", help="sequence parallelism inside tp")
    p.add_argument("--schedule", choices=SCHEDULES, default="1f1b")
    p.add_argument("--virtual", type=int, default=1, help="chunks per rank (interleaved)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--recompute", action="store_true")
    p.add_argument(
        "--dp-shard-mode",
        choices=DP_SHARD_MODES,
        default="optim",
        help="what dp_shard shards (Megatron-core's data_parallel_sharding_strategy): optim "
        "(ZeRO-1), optim_grads (ZeRO-2), optim_grads_params (ZeRO-3, FSDP per layer)",
    )
    p.add_argument(
        "--no-reshard-after-forward",
        action="store_true",
        help="FSDP: keep a layer's parameters from its forward to its backward (torchtitan's "
        "reshard_after_forward=False)",
    )
    p.add_argument(
        "--optimizer-cpu-offload",
        action="store_true",
        help="the float32 chunks and Adam's state in host memory, the step on the host "
        "(lesson 05's ZeRO-Offload; Megatron-core's optimizer_cpu_offload)",
    )
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--layers", type=positive_int, help="default 4 (lesson 17's)")
    p.add_argument("--compare", action="store_true", help="also train in one process")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole run")
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=300.0,
        help="seconds every rank may sit idle (waiting in collectives) before the run is "
        "stopped as hung, naming where each waits (a local world; under torchrun --timeout "
        "bounds each collective)",
    )
    p.add_argument("--save", help="checkpoint directory to write")
    p.add_argument("--save-every", type=int, default=0, help="steps between saves")
    p.add_argument("--async-save", action="store_true", help="write saves in the background")
    p.add_argument(
        "--keep-last",
        type=int,
        default=0,
        help="keep the newest N saves, each in DIR/step_<8 digits> (0: one "
        "checkpoint, DIR itself, replaced at each save)",
    )
    p.add_argument("--resume", help="checkpoint directory to resume from, if complete")
    p.add_argument("--log", "--log-jsonl", dest="log", help="JSONL file (rank 0 appends)")
    p.add_argument("--peak-flops", type=float, help="FLOP/s per rank the MFU is against")
    p.add_argument("--die-at", type=int, help=argparse.SUPPRESS)  # lesson 18's dead rank
    p.add_argument("--die-rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--die-once", help=argparse.SUPPRESS)
    options.add_arguments(p)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m minidist train")
    add_arguments(p)
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    """The options of `argv` (for tests and notebooks; `--config` read), checked."""
    p = parser()
    return check(p.parse_args(options.config_argv(p, argv)))


def model_name(value: str) -> str:
    """--model: a built-in's name or `package.module:function` (argparse's type)."""
    if value in MODELS or re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", value):
        return value
    raise argparse.ArgumentTypeError(
        f"{value!r} is neither a built-in model {MODELS} nor package.module:function"
    )


def show_progress(steps: int, tokens: int):
    """Rank 0's progress line: the bar, loss, eval loss, tokens/s, MFU (against
    `--peak-flops`, or the matmul fitted here under `--log`), the time left."""
    done = []

    def show(
        loss: float, seconds: float, eval_loss: float | None = None, mfu: float | None = None
    ) -> None:
        done.append(seconds)
        if dist.get_rank() == 0:
            bar = "#" * (20 * len(done) // steps)
            rate = f"{tokens / seconds:,.0f} tokens/s"
            held = "" if eval_loss is None else f" eval {eval_loss:.4f}"
            held += "" if mfu is None else f" MFU {mfu:.1%}"
            eta = f" ETA {sorted(done)[len(done) // 2] * (steps - len(done)):.0f}s"
            line = f"\r[{bar:<20}] step {len(done)}/{steps} loss {loss:.4f}{held} {rate}{eta}"
            print(line, end="", file=sys.stderr, flush=True)
            if len(done) == steps:
                print(file=sys.stderr)

    return show


def kill_rank_after(step: int, rank: int, once: str | None):
    """`after_step` callback: rank `rank` SIGKILLs itself after step `step` (with `once`, a
    marker file, only if the file does not exist yet; it is created first)."""

    def after_step(done: int, grid) -> None:
        if done == step and grid.rank == rank and not (once and os.path.exists(once)):
            if once:
                Path(once).touch()
            os.kill(os.getpid(), signal.SIGKILL)

    return after_step


def command_rank(args: argparse.Namespace, dims: dict, progress: bool = True) -> dict:
    """What each rank of the command runs: `loop.train_rank`, with rank 0's progress line
    and lesson 18's dead rank (`--die-at`) as its callbacks."""
    from .loop import train_rank

    def show(start: int, tokens: int):
        return show_progress(args.steps - start, tokens)

    die = (
        None
        if args.die_at is None
        else kill_rank_after(args.die_at, args.die_rank or 0, args.die_once)
    )
    return train_rank(args, dims, show if progress else None, die)


def _planned(args: argparse.Namespace, config: dict) -> dict:
    """`compose.theory.planned` for this run (built-in models): the most any rank holds and
    sends, by kind, the activations' peak included (the experts' all-to-all, and with ep > 1
    their activations, follow the routing: measured only)."""
    from ..compose.theory import planned
    from .loop import prepare
    from .models import build_model

    if config["model"] in ("hf", "factory"):  # the theory plans the course's models
        return {"bytes": {}, "memory": {}}
    return planned(
        build_model(config, args.seed),
        ParallelDims(**dims_of(args)),
        args.global_batch,
        args.micro_batch,
        args.precision,
        args.recompute,
        args.dp_shard_mode,
        not args.no_reshard_after_forward,
        valid_token_mean=prepare(args)[0].ignores,
        offload=args.optimizer_cpu_offload,
    )


def print_lines(lines: dict) -> None:
    """`name=value` lines: a loss in full (repr), other floats to 6 digits."""
    for name, value in lines.items():
        print(
            f"{name}={value!r}"
            if name in ("loss", "eval_loss")
            else f"{name}={value:.6g}"
            if isinstance(value, float)
            else f"{name}={value}"
        )


def ep_bound(args: argparse.Namespace, config: dict) -> dict:
    """{"planned_bytes_ep_bound": bytes} for the MoE model (else {})."""
    from ..compose.theory import ep_bytes_bound
    from .models import build_model

    if config["model"] != "moe":
        return {}
    model = build_model(config, args.seed)
    dims = ParallelDims(**dims_of(args))
    bound = ep_bytes_bound(model, dims, args.global_batch, args.micro_batch, args.precision)
    return {"planned_bytes_ep_bound": bound}


def run_train(args: argparse.Namespace) -> int:
    import minidist

    config = check_run(args)
    resolved = options.resolved_toml(args)
    if not minidist.under_torchrun() or int(os.environ.get("RANK", "0")) == 0:
        print(resolved, end="", file=sys.stderr)
        if args.save:
            options.save_config(args.save, resolved)
    dims = dims_of(args)
    world = ParallelDims(**dims).world_size
    try:
        results = minidist.launch(
            command_rank, world, args, dims, timeout_s=args.timeout, idle_s=args.idle_timeout
        )
    except (minidist.RankFailedError, minidist.WorldTimeoutError) as e:
        # the world's account (the rank that failed first and its traceback, or where each
        # rank waited), not the parent's frames inside launch; after the progress line
        print(f"\npython -m minidist train: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    torchrun = minidist.under_torchrun()
    if torchrun and dist.is_initialized():
        # every rank leaves the world together before it exits, as torchrun advises: a
        # rank exiting with its group alive, its peer still in gloo's teardown, may fail
        # its exit, and torchrun would restart a run that had finished
        comm.barrier(tag="leave")
        dist.destroy_process_group()
    # under torchrun every rank has every rank's results: rank 0 alone prints them, or each
    # rank's lines land in the one stdout torchrun shares, interleaved write by write
    if results is None or (torchrun and int(os.environ["RANK"]) != 0):
        return 0
    first = results[0]
    lines = {
        "world_size": world,
        "step": first["step"],
        "resumed_from": first["resumed_from"],
        "loss": first["losses"][-1] if first["losses"] else float("nan"),
        "step_s": first["step_s"],
        "tokens_per_s": first["tokens_per_step"] / first["step_s"],
        "params_sha256": first["params_sha256"],
    }
    if first["evals"]:
        lines["eval_loss"] = first["evals"][-1][1]
    plan = _planned(args, config)
    for what in ("bytes", "memory"):  # each measured figure, its plan beside it
        for kind in first[what]:
            lines[f"{what}_{kind}"] = max(r[what][kind] for r in results)
            if kind in plan[what]:
                lines[f"planned_{what}_{kind}"] = plan[what][kind]
    lines.update(ep_bound(args, config))  # the experts' exchange follows the routing
    if first["read"] is not None:
        lines["read_bytes_max"] = max(r["read"][0] for r in results)
        lines["shard_bytes_max"] = max(r["read"][1] for r in results)
    if args.compare:
        from ..training import max_abs_diff
        from .loop import reference

        ref = reference(args)
        start = first["resumed_from"]
        diffs = [abs(a - b) for a, b in zip(first["losses"], ref["losses"][start:])]
        lines["loss_max_abs_diff"] = max(diffs, default=0.0)
        lines["params_max_abs_diff"] = max_abs_diff(first["params"], ref["params"])
    if args.export_hf:
        lines["export_hf"] = args.export_hf
    print_lines(lines)
    return 0
