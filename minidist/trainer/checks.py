"""`python -m minidist train`'s checks in the parent, before any rank starts (`check_run`):
the options one by one, the sizes against this machine's memory (by arithmetic), the
layout against the model, the data and the checkpoint folders. Each refusal is one
`ValueError` naming the option and the rule it broke; the CLI turns it into exit 2.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

import torch

from ..cli_checks import writable_file, writable_folder
from ..compose.dims import ParallelDims
from .options import check_config_path

PATHS = ("config", "data", "tokenizer", "save", "resume", "log", "init_from_hf", "export_hf")
MAX_SEED = 2**63  # TOML's integers (the resolved configuration) and torch's seeds: int64


def check(args: argparse.Namespace) -> argparse.Namespace:
    """`args`, or a ValueError naming the option and the rule it broke (no rank started)."""
    for name in PATHS:  # "" is no path: it would have meant "not given" (no save, no data)
        if getattr(args, name, None) == "":
            raise ValueError(f"--{name.replace('_', '-')} '': an empty path names no file")
    for name in ("steps", "global_batch"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    if args.save_every < 0 or (args.save_every and not args.save):
        raise ValueError(f"--save-every={args.save_every} needs --save DIR and must be >= 0")
    if args.keep_last < 0 or (args.keep_last and not args.save):
        raise ValueError(f"--keep-last={args.keep_last} needs --save DIR and must be >= 0")
    if args.async_save and not args.save:
        raise ValueError("--async-save needs --save DIR (it writes the saves in the background)")
    if not 0 <= args.seed < MAX_SEED:
        raise ValueError(f"--seed={args.seed} must be an int in [0, 2**63)")
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
    for name in ("timeout", "idle_timeout"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value > 0):
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag}={value} must be a finite number of seconds > 0")
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
    check_die(args, world)
    return args


def check_die(args: argparse.Namespace, world: int) -> None:
    """Lesson 18's dead rank: --die-rank and --die-once only with --die-at, a step of the run,
    and a rank of the world (else the run would never die, silently)."""
    if args.die_at is None:
        for name in ("die_rank", "die_once"):
            if getattr(args, name) is not None:
                raise ValueError(f"--{name.replace('_', '-')} needs --die-at STEP")
        return
    if not 1 <= args.die_at <= args.steps:
        raise ValueError(f"--die-at={args.die_at} must be a step of the run, in [1, --steps]")
    if not 0 <= (args.die_rank or 0) < world:
        raise ValueError(f"--die-rank={args.die_rank} must be a rank of the {world}")


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


def check_model_memory(model: torch.nn.Module, config: dict, world: int) -> None:
    """The whole model (built on the meta device: its sizes, nothing allocated) in float32 on
    every rank, against this machine's memory: the vocabulary and the MLP's width count too."""
    n = sum(p.numel() for p in model.parameters())
    ram = physical_memory()
    if world * 4 * n > ram:
        sizes = ", ".join(f"{k}={config[k]}" for k in ("vocab", "hidden", "ffn") if k in config)
        given = (
            f"--init-from-hf {config['path']}'s config.json"
            if config["model"] == "hf"
            else "--vocab, --hidden, --ffn or --data's largest token id"
        )
        raise ValueError(
            f"the {config['model']} model ({sizes}; {given}) has {n:,} parameters: each "
            f"rank builds it whole, {world} x "
            f"{4 * n / 1e9:.3g} GB of float32 weights at least, more than this machine's "
            f"{ram / 1e9:.3g} GB"
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
    from .models import build_model, check_export, check_hf_weights, hf_skeleton

    check(args)
    data, config, _ = prepare(args)
    experts = config.get("experts", 4 if config["model"] == "moe" else 0)
    ParallelDims(**dims_of(args)).check_model(
        config["heads"], config["layers"], data.seq_len, experts
    )
    world = ParallelDims(**dims_of(args)).world_size
    if config["model"] == "hf":  # what parallelize cannot compose, from the bare structure
        model = hf_skeleton(config)
        check_model_memory(model, config, world)
        check_layout(model, ParallelDims(**dims_of(args)), data.seq_len)
        check_hf_weights(model, config["path"])
    if config["model"] in ("gpt", "llama", "moe"):  # the course's models, built on meta
        with torch.device("meta"):
            model = build_model(config, args.seed)
        check_model_memory(model, config, world)
        check_course_layout(model, ParallelDims(**dims_of(args)))
    if config["model"] == "factory":
        check_layout(build_model(config, args.seed), ParallelDims(**dims_of(args)), data.seq_len)
    if args.moe_bias_update_speed:
        check_routers(config, args.seed)
    if args.export_hf:
        check_export(config, args.export_hf, args.save)
    if args.save:
        check_kept(args)
        check_config_path(args.save)
    if args.log:
        check_log(Path(args.log))
    if args.resume and Path(args.resume).exists() and not Path(args.resume).is_dir():
        raise ValueError(f"--resume {args.resume}: not a folder (a checkpoint is a folder)")
    resume = newest(args.resume) if args.resume else None
    if resume is not None:
        refuse_another_run(resume, layout_of(args, dims_of(args), config, data.identity()))
    return config


def check_log(path: Path) -> None:
    """--log FILE: a file rank 0 may append to: a new one, or a log of an earlier run (its
    first line a JSON object); never a user's other file, nor a FIFO or device (a FIFO
    without a reader blocks rank 0's open forever)."""
    import json

    if why := writable_file(path):
        raise ValueError(f"--log {path}: {why}")
    if not path.exists():
        return
    if not path.is_file():
        raise ValueError(f"--log {path}: not a regular file (a JSONL log is one)")
    with open(path, "rb") as f:
        first = f.readline(1 << 20)
    try:
        ok = not first.strip() or isinstance(json.loads(first), dict)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"--log {path}: exists and is not a JSONL log (its first line is not a JSON "
            "object): never appended to; log into a new file"
        )


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
