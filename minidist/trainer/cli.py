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
- A dead rank for lesson 18's demonstration: `--die-at S --die-rank R [--die-once MARKER]`,
  rank R SIGKILLs itself after step S's save (once: not again when MARKER exists); the loop
  knows nothing of it (`kill_rank_after`, a callback).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from ..cli_checks import positive_int, writable_file, writable_folder
from ..compose.dims import SCHEDULES, ParallelDims
from ..compose.fixture import MODELS
from ..compose.fsdp import MODES as DP_SHARD_MODES
from . import options


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
    p.add_argument("--die-rank", type=int, default=0, help=argparse.SUPPRESS)
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


def check(args: argparse.Namespace) -> argparse.Namespace:
    """`args`, or a ValueError naming the option and the rule it broke (no rank started)."""
    for name in ("steps", "global_batch"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    if args.save_every < 0 or (args.save_every and not args.save):
        raise ValueError(f"--save-every={args.save_every} needs --save DIR and must be >= 0")
    if args.keep_last < 0 or (args.keep_last and not args.save):
        raise ValueError(f"--keep-last={args.keep_last} needs --save DIR and must be >= 0")
    if args.eval_every < 0:
        raise ValueError(f"--eval-every={args.eval_every} must be >= 0")
    if args.no_reshard_after_forward and args.dp_shard_mode != "optim_grads_params":
        raise ValueError(
            "--no-reshard-after-forward needs --dp-shard-mode optim_grads_params (only FSDP "
            "frees a layer's parameters)"
        )
    speed = args.moe_bias_update_speed
    if not (math.isfinite(speed) and speed >= 0):
        raise ValueError(f"--moe-bias-update-speed={speed} must be a finite number >= 0")
    if args.micro_batch < 1:
        raise ValueError(f"--micro-batch={args.micro_batch} must be >= 1")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise ValueError(f"--timeout={args.timeout} must be a finite number of seconds > 0")
    if args.peak_flops is not None and not (math.isfinite(args.peak_flops) and args.peak_flops > 0):
        raise ValueError(f"--peak-flops={args.peak_flops} must be a finite number > 0")
    world = ParallelDims(**dims_of(args)).world_size  # bad sizes refused here too
    d = args.dp_replicate * args.dp_shard
    if args.global_batch % (d * args.micro_batch):
        raise ValueError(
            f"--global-batch={args.global_batch} must divide by --dp-replicate·--dp-shard·"
            f"--micro-batch = {args.dp_replicate}·{args.dp_shard}·{args.micro_batch}"
        )
    check_memory(args, world)
    m = args.global_batch // (d * args.micro_batch)
    if args.schedule == "dualpipev" and m < 2 * args.pp:
        raise ValueError(
            f"--schedule dualpipev needs micro-batches global_batch/(dp·"
            f"micro_batch) = {m} >= 2·pp = {2 * args.pp} (both chunks' "
            "pipelines filled)"
        )
    if args.die_at is not None and not 0 <= args.die_rank < world:
        raise ValueError(f"--die-rank={args.die_rank} must be a rank of the {world}")
    return args


def physical_memory() -> int:
    """This machine's RAM in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_memory(args: argparse.Namespace, world: int) -> None:
    """Sizes that cannot fit in this machine's memory, refused by arithmetic before anything
    is built: every rank first builds the whole model in float32 (at least 12·L·h² weights
    for L blocks of width h, Kaplan et al. 2020's count), and without --data the course's
    text is cut into (steps + eval batches) · global batch rows of seq + 1 int64 tokens,
    inputs and targets, up front."""
    from ..planner.model_spec import MAX_LAYERS
    from .models import DEFAULTS

    ram = physical_memory()
    hidden, layers = args.hidden or DEFAULTS["hidden"], args.layers or DEFAULTS["layers"]
    if layers > MAX_LAYERS:  # built block by block: beyond this the build alone takes minutes
        raise ValueError(f"--layers={layers} must be at most {MAX_LAYERS}")
    weights = world * 4 * 12 * layers * hidden**2
    if weights > ram:
        raise ValueError(
            f"--layers={layers} --hidden={hidden} on {world} rank(s): each rank builds the whole "
            f"model, {world} x {4 * 12 * layers * hidden**2 / 1e9:.3g} GB of float32 weights at "
            f"least, more than this machine's {ram / 1e9:.3g} GB"
        )
    if not args.data:
        seq = args.seq_len or DEFAULTS["seq_len"]
        rows = (args.steps + (args.eval_batches if args.eval_every else 0)) * args.global_batch
        need = rows * 2 * (seq + 1) * 8
        if need > ram // 2:
            raise ValueError(
                f"--steps={args.steps} x --global-batch={args.global_batch} of the course's "
                f"text: {rows} rows of {seq} tokens would take {need / 1e9:.3g} GB, more than "
                f"half this machine's {ram / 1e9:.3g} GB (give --data, or fewer steps)"
            )


def dims_of(args: argparse.Namespace) -> dict:
    return dict(
        dp_replicate=args.dp_replicate,
        dp_shard=args.dp_shard,
        cp=args.cp,
        tp=args.tp,
        sp=args.sp,
        pp=args.pp,
        schedule=args.schedule,
        virtual=args.virtual,
        ep=args.ep,
    )


def check_run(args: argparse.Namespace) -> dict:
    """In the parent, before any rank starts: the options, the data, the model's sizes
    against the layout, the optimizer, the export folder, a resume of another run -> the
    model's configuration."""
    from ..checkpoint_files import newest
    from ..compose.layout_check import check_course_layout, check_layout
    from .loop import layout_of, prepare, refuse_another_run
    from .models import build_model, check_export, skeleton

    check(args)
    data, config, _ = prepare(args)
    experts = config.get("experts", 4 if config["model"] == "moe" else 0)
    ParallelDims(**dims_of(args)).check_model(
        config["heads"], config["layers"], data.seq_len, experts
    )
    if config["model"] == "hf":  # what parallelize cannot compose, from the bare structure
        check_layout(skeleton(config), ParallelDims(**dims_of(args)), data.seq_len)
    if config["model"] in ("gpt", "llama", "moe"):  # the course's models, built on meta
        with torch.device("meta"):
            model = build_model(config, args.seed)
        check_course_layout(model, ParallelDims(**dims_of(args)))
    if config["model"] == "factory":
        check_layout(build_model(config, args.seed), ParallelDims(**dims_of(args)), data.seq_len)
    if args.moe_bias_update_speed:
        check_routers(config, args.seed)
    if args.export_hf:
        check_export(config, args.export_hf)
    if args.save:
        check_kept(args)
    if args.log and (why := writable_file(Path(args.log))):
        raise ValueError(f"--log {args.log}: {why}")
    resume = newest(args.resume) if args.resume else None
    if resume is not None:
        refuse_another_run(resume, layout_of(args, dims_of(args), config, data.identity()))
    return config


def check_routers(config: dict, seed: int) -> None:
    """--moe-bias-update-speed needs a model with DeepSeek-V3's biased routers."""
    from ..deepseek.moe import routers
    from .models import build_model, skeleton

    kind = config["model"]
    model = (
        skeleton(config)
        if kind == "hf"
        else build_model(config, seed)
        if kind == "factory"
        else None
    )
    if model is None or not routers(model):
        raise ValueError(
            f"--moe-bias-update-speed: the {kind} model has no router with a "
            "selection bias (DeepSeek-V3's e_score_correction_bias)"
        )


def check_kept(args: argparse.Namespace) -> None:
    """--save DIR against what DIR holds: `--keep-last N` writes step_ folders into DIR, so
    DIR must not be a checkpoint itself, and older step_ checkpoints there must be this run's
    (`--resume DIR`: the newest N are kept, the rest removed); without it, DIR must not hold
    step_ checkpoints (the save would replace DIR with all of them)."""
    from ..checkpoint_files import is_complete, step_checkpoints

    save = Path(args.save)
    kept = step_checkpoints(save)
    if args.keep_last and is_complete(save):
        raise ValueError(
            f"--keep-last={args.keep_last}: --save {save} is a checkpoint saved "
            "without --keep-last; save into another folder"
        )
    if (
        args.keep_last
        and kept
        and not (args.resume and Path(args.resume).resolve() == save.resolve())
    ):
        raise ValueError(
            f"--keep-last={args.keep_last}: --save {save} holds checkpoints to "
            f"{kept[-1][1].name} of another run: go on from them with --resume "
            f"{save}, or save into another folder"
        )
    if not args.keep_last and kept:
        raise ValueError(
            f"--save {save} holds --keep-last checkpoints (to {kept[-1][1].name})"
            ": pass --keep-last N, or save into another folder"
        )
    if not args.keep_last and save.exists() and not is_complete(save):
        raise ValueError(  # the save would refuse it after training: a user's folder
            f"--save {save} exists and is not a checkpoint: it would not be replaced; "
            "save into a new folder"
        )
    if why := writable_folder(save if args.keep_last else save.parent):
        raise ValueError(f"--save {save}: {why}")


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
        None if args.die_at is None else kill_rank_after(args.die_at, args.die_rank, args.die_once)
    )
    return train_rank(args, dims, show if progress else None, die)


def _planned(args: argparse.Namespace, config: dict) -> dict:
    """`compose.theory.planned` for this run (built-in models): the most any rank holds and
    sends, by kind (the experts' all-to-all depends on the routing and the activations on
    the schedule's walk: measured only)."""
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
            path = options.config_path(args.save)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(resolved)
    dims = dims_of(args)
    world = ParallelDims(**dims).world_size
    results = minidist.launch(command_rank, world, args, dims, timeout_s=args.timeout)
    if results is None or results[0] is None:  # a torchrun rank other than 0
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
