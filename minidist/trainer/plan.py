"""`python -m minidist plan --model ...`: the plan of one `train` run, no rank started.

Given `--model` (or `--config`, or a grid size only `train` has: `--dp-shard`,
`--dp-replicate`), `plan` takes `train`'s own options and runs `train`'s own checks in the
parent (`cli.check_run`), so it accepts exactly the layouts `train` accepts and refuses the
others with the same line (exit 2). It then prints lesson 17's plan of the run
(`compose.theory.planned`: what the most loaded rank holds and sends, by kind) under the
names `train` prints beside its measured figures (`planned_memory_*`, `planned_bytes_*`).
For the MoE model it adds the experts' all-to-all bound (`planned_bytes_ep_bound`: every
rank padded to capacity, GShard's static shapes; the exact exchange sends at most that).
Lesson 13's analytic planner (no `--model`) is `planner/cli.py`.

The activations' peak (`planned_memory_activations`) is `compose.activations`' walk of the
rank's schedule. Not planned: the MoE's activations with ep > 1 and no recomputation (its
experts' rows follow the routing), and a transformers model's figures (the theory plans the
course's three models).
"""

from __future__ import annotations

import argparse
import sys

TRAIN_ONLY = ("--model", "--config", "--dp-shard", "--dp-replicate")


def wanted(argv: list[str]) -> bool:
    """`plan` options that name a `train` run (lesson 13's planner has none of them)."""
    return any(a.split("=", 1)[0] in TRAIN_ONLY for a in argv)


def parser() -> argparse.ArgumentParser:
    from .cli import add_arguments

    p = argparse.ArgumentParser(
        prog="python -m minidist plan",
        description="plan one `python -m minidist train` run (its options; lesson 17's theory)",
    )
    add_arguments(p)
    return p


def planned_lines(args: argparse.Namespace, config: dict) -> dict:
    """{name: value}: the world and the plan, in `train`'s names."""
    from ..compose.dims import ParallelDims
    from .cli import _planned, dims_of, ep_bound

    lines: dict = {"world_size": ParallelDims(**dims_of(args)).world_size}
    plan = _planned(args, config)
    for what in ("bytes", "memory"):
        for kind, value in plan[what].items():
            lines[f"planned_{what}_{kind}"] = value
    return {**lines, **ep_bound(args, config)}


def run_composed_plan(argv: list[str]) -> int:
    from .cli import check_run, print_lines
    from .options import config_argv

    p = parser()
    try:
        args = p.parse_args(config_argv(p, argv))
        config = check_run(args)  # train's own checks: the same layouts refused, in the parent
    except ValueError as e:
        p.error(str(e))
    if config["model"] in ("hf", "factory"):
        print(
            "plan: note: lesson 17's theory plans the course's models (gpt, llama, moe); "
            "a transformers model's memory and bytes are measured by train",
            file=sys.stderr,
        )
    print_lines(planned_lines(args, config))
    return 0
