"""`python -m minidist train` with checkpoints: lesson 17's command, lesson 18's options.

    python -m minidist train --model llama --dp-shard 2 --tp 2 --steps 8 --save ck \\
        --save-every 2 --log run.jsonl
    python -m minidist train --model llama --dp-shard 4 --steps 12 --resume ck --save ck
    torchrun --nproc-per-node 4 --max-restarts 3 -m minidist train --dp-shard 2 --tp 2 \\
        --steps 12 --save ck --save-every 2 --resume ck --log-jsonl run.jsonl

- `--steps N` is the total: a resumed run goes on from the checkpoint's step to N.
- `--resume DIR` loads DIR when it holds a complete checkpoint (else starts afresh), on any
  layout (`universal.load`: refused, naming both layouts, before anything changes, when it
  cannot serve this one); under torchrun's `--max-restarts` a restarted world resumes from
  the last complete save and loses at most `--save-every` steps.
- `--log FILE` (rank 0 appends JSON lines, `train.py`). Under torchrun spell it
  `--log-jsonl`: torchrun's parser sees every argument, and reads `--log` as an ambiguous
  prefix of its own `--log-dir`, `--log-line-prefix-template`, ...
- The run ends with `name=value` lines: `step=`, `loss=` (repr: every bit),
  `resumed_from=`, `params_sha256=` (to compare runs bit for bit), the step time,
  tokens/s, the bytes and memory by kind (largest over the ranks), `read_bytes_max=` and
  `shard_bytes_max=` on a resume, and with `--compare` the one-process run's differences.

Without any of these options the command is lesson 17's (`compose.cli.run_train`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..cli_checks import positive_int
from ..compose import cli as compose_cli
from ..compose.dims import ParallelDims
from ..trainer import options


def add_arguments(p: argparse.ArgumentParser) -> None:
    compose_cli.add_arguments(p)
    p.add_argument("--layers", type=positive_int, help="default 4 (lesson 17's)")
    p.add_argument("--save", help="checkpoint directory to write")
    p.add_argument("--save-every", type=int, default=0, help="steps between saves")
    p.add_argument("--resume", help="checkpoint directory to resume from, if complete")
    p.add_argument("--log", "--log-jsonl", dest="log", help="JSONL file (rank 0 appends)")
    p.add_argument("--peak-flops", type=float, help="FLOP/s per rank the MFU is against")
    p.add_argument("--die-at", type=int, help="a rank SIGKILLs itself after this step")
    p.add_argument("--die-rank", type=int, default=0)
    p.add_argument("--die-once", help="marker file: die only if it does not exist")
    options.add_arguments(p)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m minidist train")
    add_arguments(p)
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    """The options of `argv` (for tests and notebooks; `--config` read), checked."""
    p = parser()
    return check(p.parse_args(options.config_argv(p, argv)))


def check(args: argparse.Namespace) -> argparse.Namespace:
    """`args`, or a ValueError naming the option and the rule it broke (no rank started)."""
    for name in ("steps", "global_batch"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    if args.save_every < 0 or (args.save_every and not args.save):
        raise ValueError(f"--save-every={args.save_every} needs --save DIR and must be >= 0")
    if args.eval_every < 0:
        raise ValueError(f"--eval-every={args.eval_every} must be >= 0")
    world = ParallelDims(**dims_of(args)).world_size  # bad sizes refused here too
    if args.die_at is not None and not 0 <= args.die_rank < world:
        raise ValueError(f"--die-rank={args.die_rank} must be a rank of the {world}")
    return args


def dims_of(args: argparse.Namespace) -> dict:
    return dict(dp_replicate=args.dp_replicate, dp_shard=args.dp_shard, cp=args.cp,
                tp=args.tp, sp=args.sp, pp=args.pp, schedule=args.schedule,
                virtual=args.virtual, ep=args.ep)  # fmt: skip


def check_run(args: argparse.Namespace) -> dict:
    """In the parent, before any rank starts: the data, the model's sizes against the
    layout, the optimizer, the folders, a resume of another run -> the model's config."""
    from ..checkpoint_files import is_complete
    from ..trainer.models import check_export
    from .train import layout_of, prepare, refuse_another_run

    check(args)
    data, config, _ = prepare(args)
    dims = ParallelDims(**dims_of(args))
    experts = config.get("experts", 4 if config["model"] == "moe" else 0)
    dims.check_model(config["heads"], config["layers"], data.seq_len, experts)
    if args.export_hf:
        check_export(config, args.export_hf)
    if args.resume and is_complete(Path(args.resume)):
        refuse_another_run(Path(args.resume), layout_of(args, dims_of(args), config,
                                                        data.identity()))  # fmt: skip
    return config


def _lesson17(args: argparse.Namespace) -> bool:
    """Whether the command is lesson 17's alone (no option of lesson 18 or the trainer)."""
    defaults = vars(parser().parse_args([]))
    lesson17 = argparse.ArgumentParser()
    compose_cli.add_arguments(lesson17)
    mine = set(vars(lesson17.parse_args([])))
    return all(getattr(args, k) == v for k, v in defaults.items() if k not in mine)


def _rank(args: argparse.Namespace, dims: dict) -> dict:
    from .train import train_rank

    def progress(start: int, tokens: int):
        return compose_cli._progress(args.steps - start, tokens)

    return train_rank(args, dims, progress)


def run_train(args: argparse.Namespace) -> int:
    import minidist

    if _lesson17(args):
        return compose_cli.run_train(args)
    check_run(args)
    resolved = options.resolved_toml(args)
    rank0 = not minidist.under_torchrun() or int(os.environ.get("RANK", "0")) == 0
    if rank0:
        print(resolved, end="", file=sys.stderr)
        if args.save:
            path = options.config_path(args.save)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(resolved)
    dims = dims_of(args)
    world = ParallelDims(**dims).world_size
    results = minidist.launch(_rank, world, args, dims, timeout_s=args.timeout)
    if results is None or results[0] is None:  # a torchrun rank other than 0
        return 0
    first = results[0]
    tokens = first["tokens_per_step"]
    lines = {"world_size": world, "step": first["step"], "resumed_from": first["resumed_from"],
             "loss": first["losses"][-1] if first["losses"] else float("nan"),
             "step_s": first["step_s"], "tokens_per_s": tokens / first["step_s"],
             "params_sha256": first["params_sha256"]}  # fmt: skip
    if first["evals"]:
        lines["eval_loss"] = first["evals"][-1][1]
    for what in ("bytes", "memory"):
        for kind in first[what]:
            lines[f"{what}_{kind}"] = max(r[what][kind] for r in results)
    if first["read"] is not None:
        lines["read_bytes_max"] = max(r["read"][0] for r in results)
        lines["shard_bytes_max"] = max(r["read"][1] for r in results)
    if args.compare:
        from ..training import max_abs_diff
        from .train import reference

        ref = reference(args)
        diffs = [
            abs(a - b) for a, b in zip(first["losses"], ref["losses"][first["resumed_from"] :])
        ]
        lines["loss_max_abs_diff"] = max(diffs, default=0.0)
        lines["params_max_abs_diff"] = max_abs_diff(first["params"], ref["params"])
    if args.export_hf:
        lines["export_hf"] = args.export_hf
    for name, value in lines.items():
        print(f"{name}={value!r}" if name in ("loss", "eval_loss") else
              f"{name}={value:.6g}" if isinstance(value, float) else f"{name}={value}")  # fmt: skip
    return 0
