"""`python -m minidist plan`: one layout's `name=value` lines (its memory, whether it fits,
its bytes, bubble and step time), then the best layouts of the world for a memory budget,
and (with `--plot`) the sweep of memory against step time. Notes go to stderr."""

from __future__ import annotations

import argparse
import sys

from ..pipeline.schedules import KINDS
from .fixture import sweep_micro_batch
from .hardware import CLUSTERS
from .plan import best, plan, sweep
from .spec import Layout, ModelSpec

GIB = 1024**3
MODEL_FIELDS = {
    "layers": "transformer blocks",
    "hidden": "hidden size h",
    "heads": "attention heads a",
    "vocab": "vocabulary size V",
    "seq": "sequence length s",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    model = parser.add_argument_group("model: a GPT configuration, or --params alone")
    model.add_argument(
        "--params", type=float, help="parameter count: then only model states and data-parallel "
        "bytes are planned (no activations, tp or pp)",
    )  # fmt: skip
    for name, what in MODEL_FIELDS.items():
        model.add_argument(f"--{name}", type=int, help=what)
    layout = parser.add_argument_group("layout")
    layout.add_argument("--world", type=int, required=True, help="ranks (devices) in all")
    layout.add_argument("--tp", type=int, default=1, help="tensor-parallel size t (lesson 07)")
    layout.add_argument("--pp", type=int, default=1, help="pipeline stages p (lesson 09)")
    layout.add_argument("--dp", type=int, help="data-parallel size d (default: world / (t·p))")
    layout.add_argument(
        "--zero", type=int, default=0, choices=(0, 1, 2, 3),
        help="ZeRO stage over dp: 0 = DDP, 1-2 (lesson 02), 3 = FSDP (lesson 03)",
    )  # fmt: skip
    layout.add_argument("--shard-size", type=int, help="FSDP hybrid shard group (zero 3)")
    layout.add_argument(
        "--micro-batch", type=int,
        help="sequences per micro-batch; every layout runs global batch / (d · this) of them "
        "(Megatron-LM's convention; default 1 unless --microbatches is given)",
    )  # fmt: skip
    layout.add_argument("--microbatches", type=int, help="micro-batches per step, fixed")
    layout.add_argument("--schedule", default="1f1b", choices=KINDS, help="pipeline schedule")
    layout.add_argument("--virtual", type=int, default=1, help="chunks per rank (interleaved)")
    layout.add_argument(
        "--precision", default="mixed", choices=("fp32", "mixed"),
        help="mixed: 16-bit parameters, gradients and activations, fp32 masters (ZeRO's 2+2+12)",
    )  # fmt: skip
    layout.add_argument("--optimizer", default="adam", choices=("sgd", "adam"))
    layout.add_argument("--recompute", action="store_true", help="full recomputation (lesson 06)")
    layout.add_argument(
        "--offload", default="device", choices=("device", "cpu", "disk"),
        help="where FSDP's optimizer runs and keeps its state (lesson 05)",
    )  # fmt: skip
    layout.add_argument(
        "--global-batch", type=int, help="sequences per step (default: world × micro-batch)"
    )
    where = parser.add_argument_group("where it runs")
    where.add_argument("--cluster", default="dgx-h100", choices=sorted(CLUSTERS))
    where.add_argument("--memory-gib", type=float, help="budget per rank (default: the device's)")
    where.add_argument("--top", type=int, default=5, help="best layouts to list")
    where.add_argument("--plot", help="save the sweep plot (memory vs step time) to this file")


def _model(args) -> ModelSpec:
    if args.params is not None:
        return ModelSpec(params=int(args.params))
    missing = [n for n in MODEL_FIELDS if getattr(args, n) is None]
    if missing:
        raise SystemExit(f"plan: give --params, or all of --layers --hidden --heads --vocab "
                         f"--seq (missing: {', '.join('--' + m for m in missing)})")  # fmt: skip
    return ModelSpec(args.layers, args.hidden, args.heads, args.vocab, args.seq)


def _batching(args, dp: int) -> tuple[int, int, int | None]:
    """(global batch, micro-batches of the chosen layout, micro-batch size for the sweep)."""
    micro_batch = args.micro_batch  # it wins over --microbatches; neither given: 1
    if args.microbatches is None and micro_batch is None:
        micro_batch = 1
    global_batch = args.global_batch or args.world * (micro_batch or args.microbatches)
    if micro_batch is None:
        return global_batch, args.microbatches, None
    if global_batch % (dp * micro_batch):
        raise SystemExit(
            f"plan: --global-batch {global_batch} does not split into micro-batches of "
            f"{micro_batch} sequences over dp={dp}"
        )
    return global_batch, global_batch // (dp * micro_batch), micro_batch


def run_plan(args) -> int:
    model = _model(args)
    cluster = CLUSTERS[args.cluster]
    if args.dp is None and args.world % (args.tp * args.pp):
        raise SystemExit(
            f"plan: --world {args.world} is not divisible by --tp {args.tp} × --pp {args.pp}"
        )
    dp = args.dp if args.dp is not None else args.world // (args.tp * args.pp)
    global_batch, microbatches, micro_batch = _batching(args, dp)
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
    budget = (args.memory_gib * GIB) if args.memory_gib else cluster.device.memory_bytes
    for line in chosen.lines():
        print(line)
    print(f"memory_bytes_per_rank={int(round(chosen.memory_per_rank))}")
    print(f"fits={'yes' if chosen.fits(budget) else 'no'}")
    if layout.pp > 1 and layout.microbatches < layout.pp:
        print(
            f"plan: note: pp={layout.pp} with {layout.microbatches} micro-batch(es) leaves the "
            f"pipeline idle {chosen.bubble:.0%} of the step; more micro-batches shrink it",
            file=sys.stderr,
        )
    if not model.has_config:
        return 0
    if micro_batch is not None:
        plans = sweep_micro_batch(model, args.world, cluster, micro_batch, **fixed)
    else:
        plans = sweep(model, args.world, cluster, microbatches=microbatches, **fixed)
    ranked = best(plans, budget)
    print(
        f"# best of {len(plans)} layouts of {args.world} ranks ({len(ranked)} fit in "
        f"{budget / GIB:.1f} GiB per rank), fastest first"
    )
    for p in ranked[: args.top]:
        lay = p.layout
        print(
            f"layout=dp{lay.dp}.tp{lay.tp}.pp{lay.pp}.zero{lay.zero} m={lay.microbatches} "
            f"memory_gib={p.memory_per_rank / GIB:.2f} step_time_s={p.time.total_s:.4g} "
            f"bound={p.time.bound}"
        )
    if args.plot:
        from .plots import plot_sweep

        plot_sweep(plans, budget, highlight=chosen).savefig(args.plot, dpi=100, bbox_inches="tight")
        print(f"# wrote {args.plot}")
    return 0
