"""`python -m minidist plan`: one layout's `name=value` lines, then the best layouts of the
world for a memory budget, and (with `--plot`) the sweep of memory against step time."""

from __future__ import annotations

import argparse

from .fixture import sweep_micro_batch
from .hardware import CLUSTERS
from .plan import best, plan, sweep
from .spec import Layout, ModelSpec

GIB = 1024**3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model: a GPT configuration, or --params alone")
    model.add_argument("--params", type=float, help="parameter count (then model states only)")
    for name in ("layers", "hidden", "heads", "vocab", "seq"):
        model.add_argument(f"--{name}", type=int)
    layout = parser.add_argument_group("layout")
    layout.add_argument("--world", type=int, required=True, help="ranks in all")
    layout.add_argument("--tp", type=int, default=1)
    layout.add_argument("--pp", type=int, default=1)
    layout.add_argument("--dp", type=int, help="default: world / (tp · pp)")
    layout.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3))
    layout.add_argument("--shard-size", type=int, help="FSDP hybrid shard group")
    layout.add_argument("--microbatches", type=int, default=1)
    layout.add_argument(
        "--micro-batch", type=int,
        help="sequences per micro-batch: every layout then runs global batch / (dp · this) "
        "micro-batches (overrides --microbatches; Megatron-LM's convention)",
    )  # fmt: skip
    layout.add_argument("--schedule", default="1f1b")
    layout.add_argument("--virtual", type=int, default=1)
    layout.add_argument("--precision", default="mixed", choices=("fp32", "mixed"))
    layout.add_argument("--optimizer", default="adam", choices=("sgd", "adam"))
    layout.add_argument("--recompute", action="store_true")
    layout.add_argument("--offload", default="device", choices=("device", "cpu", "disk"))
    layout.add_argument("--global-batch", type=int, help="sequences per step (default: world)")
    where = parser.add_argument_group("where it runs")
    where.add_argument("--cluster", default="dgx-h100", choices=sorted(CLUSTERS))
    where.add_argument("--memory-gib", type=float, help="budget per rank (default: the device's)")
    where.add_argument("--top", type=int, default=5, help="best layouts to list")
    where.add_argument("--plot", help="save the sweep plot to this file")


def _model(args) -> ModelSpec:
    if args.params is not None:
        return ModelSpec(params=int(args.params))
    missing = [n for n in ("layers", "hidden", "heads", "vocab", "seq") if getattr(args, n) is None]
    if missing:
        raise SystemExit(f"plan: give --params, or all of --layers --hidden --heads --vocab "
                         f"--seq (missing: {', '.join('--' + m for m in missing)})")  # fmt: skip
    return ModelSpec(args.layers, args.hidden, args.heads, args.vocab, args.seq)


def run_plan(args) -> int:
    model = _model(args)
    cluster = CLUSTERS[args.cluster]
    if args.dp is None and args.world % (args.tp * args.pp):
        raise SystemExit(
            f"plan: --world {args.world} is not divisible by --tp {args.tp} × --pp {args.pp}"
        )
    dp = args.dp if args.dp is not None else args.world // (args.tp * args.pp)
    microbatches = args.microbatches
    global_batch = args.global_batch or args.world * (args.micro_batch or microbatches)
    if args.micro_batch:
        if global_batch % (dp * args.micro_batch):
            raise SystemExit(
                f"plan: --global-batch {global_batch} does not split into micro-batches of "
                f"--micro-batch {args.micro_batch} over dp={dp}"
            )
        microbatches = global_batch // (dp * args.micro_batch)
    fixed = dict(
        schedule=args.schedule, virtual=args.virtual, precision=args.precision,
        optimizer=args.optimizer, recompute=args.recompute, global_batch=global_batch,
    )  # fmt: skip
    try:
        layout = Layout(
            dp=dp, tp=args.tp, pp=args.pp, zero=args.zero, shard_size=args.shard_size,
            offload=args.offload, microbatches=microbatches, **fixed,
        )  # fmt: skip
        chosen = plan(model, layout, cluster if model.has_config else None, world=args.world)
    except ValueError as err:
        raise SystemExit(f"plan: {err}") from None
    for line in chosen.lines():
        print(line)
    if not model.has_config:
        return 0
    budget = (args.memory_gib * GIB) if args.memory_gib else cluster.device.memory_bytes
    if args.micro_batch:
        plans = sweep_micro_batch(model, args.world, cluster, args.micro_batch, **fixed)
    else:
        plans = sweep(model, args.world, cluster, microbatches=microbatches, **fixed)
    print(f"# best layouts of {args.world} ranks within {budget / GIB:.1f} GiB per rank")
    for p in best(plans, budget)[: args.top]:
        lay = p.layout
        print(
            f"layout=dp{lay.dp}.tp{lay.tp}.pp{lay.pp}.zero{lay.zero} "
            f"memory_gib={p.memory_per_rank / GIB:.2f} step_time_s={p.time.total_s:.4g} "
            f"bound={p.time.bound}"
        )
    if args.plot:
        from .plots import plot_sweep

        plot_sweep(plans, budget).savefig(args.plot, dpi=100, bbox_inches="tight")
        print(f"wrote {args.plot}")
    return 0
