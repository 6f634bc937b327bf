"""`python -m minidist plan`: one layout's `name=value` lines (its memory, whether it fits and
against which budget, its bytes, bubble and step time), then the best layouts of the world
for that budget, and (with `--plot`) the sweep of memory against step time. Byte counts
carry GB and GiB beside them; notes go to stderr. The options and their rules are in
`cli_args.py`."""

from __future__ import annotations

import sys

from .cli_args import add_arguments, dp_size, layout_error, model_spec, validate
from .fixture import sweep_micro_batch
from .hardware import CLUSTERS
from .plan import Plan, best, plan, sweep
from .spec import Layout

GIB = 1024**3
__all__ = ["add_arguments", "run_plan"]


def human(n: float) -> str:
    """1.23 GB, 1.15 GiB (or MB and MiB, kB and KiB, B)."""
    for decimal, binary, unit in ((1e12, 2**40, "T"), (1e9, 2**30, "G"), (1e6, 2**20, "M")):
        if n >= decimal:
            return f"{n / decimal:.2f} {unit}B, {n / binary:.2f} {unit}iB"
    return f"{n / 1e3:.2f} kB, {n / 2**10:.2f} KiB" if n >= 1e3 else f"{n:.0f} B"


def _annotated(line: str) -> str:
    name, value = line.split("=", 1)
    return f"{line} ({human(float(value))})" if "bytes" in name and value.isdigit() else line


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _batching(args, dp: int) -> tuple[int, int, int | None]:
    """(global batch, micro-batches of the chosen layout, micro-batch size for the sweep)."""
    micro_batch = args.micro_batch  # it wins over --microbatches; neither given: 1
    if args.experts and args.microbatches is None and micro_batch is None:
        args.microbatches = 1  # lesson 16 routes a rank's whole batch at once (one capacity)
    if args.microbatches is None and micro_batch is None:
        micro_batch = 1
    global_batch = args.global_batch or args.world * (micro_batch or args.microbatches)
    if micro_batch is None:
        return global_batch, args.microbatches, None
    if global_batch % (dp * micro_batch):
        args.plan_parser.error(
            f"--global-batch {global_batch} does not split into micro-batches of "
            f"{_plural(micro_batch, 'sequence')} over dp = {dp}"
        )
    return global_batch, global_batch // (dp * micro_batch), micro_batch


def _bubble_line(p: Plan) -> str:
    """The idle share, with Narayanan et al. 2021's ratio to the ideal time beside it."""
    if p.layout.pp == 1:
        return f"bubble={p.bubble:.4f}"
    ratio = p.bubble / (1 - p.bubble)
    return (
        f"bubble={p.bubble:.4f} (idle share of the step; Narayanan et al.'s bubble over the "
        f"ideal time, (p-1)/m for 1F1B: {ratio:.4f})"
    )


def _fit_lines(chosen: Plan, budget: float, budget_from: str) -> list[str]:
    out = [
        f"memory_bytes_per_rank={int(round(chosen.memory_per_rank))} "
        f"({human(chosen.memory_per_rank)}"
        + ("" if chosen.activations_planned else "; model states only")
        + ")",
        f"budget_bytes_per_rank={int(round(budget))} ({human(budget)}: {budget_from})",
    ]
    used = f"{human(chosen.memory_per_rank).split(',')[0]} of {human(budget).split(',')[0]}"
    if chosen.activations_planned:
        out.append(f"fits={'yes' if chosen.fits(budget) else 'no'} ({used} per rank)")
    elif not chosen.fits_model_states(budget):
        out.append(f"fits=no (the model states alone take {used} per rank)")
    else:
        out.append(
            f"fits=unknown (model states take {used} per rank, but activations are not "
            "planned for --params: give --layers --hidden --heads --vocab --seq to judge)"
        )
    return out


def _hint(plans: list[Plan], args, budget: float) -> str:
    """What to change when no layout fits (or none exists)."""
    if not plans:
        return (
            f"# no layout of {args.world} ranks can split a global batch of "
            f"{_plural(args.global_batch_used, 'sequence')}: each replica needs whole "
            "micro-batches; change --global-batch, --micro-batch or --world"
        )
    small = min(plans, key=lambda p: p.memory_per_rank)
    lay = small.layout
    moe = bool(small.model.experts)  # lesson 16 runs no recompute, one micro-batch
    tips = [] if args.recompute or moe else ["--recompute (keeps only each block's input)"]
    if args.precision == "fp32":
        tips.append("--precision mixed")
    batch = "a smaller --global-batch" if moe else "a smaller --micro-batch or --global-batch"
    tips += [
        "more ranks (--world)",
        batch,
        f"a budget above {small.memory_per_rank / GIB:.1f} GiB (--memory-gib)",
    ]
    return (
        f"# none fits: the smallest, {layout_name(lay)}, needs "
        f"{small.memory_per_rank / GIB:.1f} GiB per rank; try {', '.join(tips)}"
    )


def layout_name(lay: Layout) -> str:
    """dp.tp.pp.zero, with .sp, .cpC and .epE when those are set."""
    name = f"dp{lay.dp}.tp{lay.tp}.pp{lay.pp}.zero{lay.zero}"
    name += (".sp" if lay.sp else "") + (f".cp{lay.cp}" if lay.cp > 1 else "")
    return name + (f".ep{lay.ep}" if lay.ep > 1 else "")


def run_plan(args) -> int:
    validate(args)
    model = model_spec(args)
    cluster = CLUSTERS[args.cluster]
    dp = dp_size(args)
    global_batch, microbatches, micro_batch = _batching(args, dp)
    args.global_batch_used = global_batch
    fixed = dict(
        schedule=args.schedule,
        virtual=args.virtual,
        precision=args.precision,
        optimizer=args.optimizer,
        recompute=args.recompute,
        global_batch=global_batch,
        reduce_in_fp32=args.reduce_dtype != "bf16",
        sp=args.sp,
        cp=args.cp,
        ep=args.ep,
    )
    try:
        layout = Layout(
            dp=dp,
            tp=args.tp,
            pp=args.pp,
            zero=args.zero,
            shard_size=args.shard_size,
            offload=args.offload,
            microbatches=microbatches,
            **fixed,
        )
        chosen = plan(model, layout, cluster if model.has_config else None, world=args.world)
    except ValueError as err:
        layout_error(args, err)
    if args.memory_gib:
        budget, budget_from = args.memory_gib * GIB, "--memory-gib"
    else:
        budget, budget_from = cluster.device.memory_bytes, f"the {cluster.device.name}'s memory"
    for line in chosen.lines():
        print(_bubble_line(chosen) if line.startswith("bubble=") else _annotated(line))
    reduce = "fp32" if layout.reduce_bytes == 4 else "bf16"
    print(f"grad_reduce_dtype={reduce} (the data-parallel gradient collectives; --reduce-dtype)")
    print("\n".join(_fit_lines(chosen, budget, budget_from)))
    if layout.pp > 1 and layout.microbatches < layout.pp:
        print(
            f"plan: note: pp={layout.pp} with {_plural(layout.microbatches, 'micro-batch')} "
            f"leaves the pipeline idle {chosen.bubble:.0%} of the step; more micro-batches "
            "shrink it",
            file=sys.stderr,
        )
    if not model.has_config:
        return 0
    if model.experts:  # the sweep places the experts every way (ep dividing dp and E)
        fixed = {k: v for k, v in fixed.items() if k != "ep"}
    if micro_batch is not None:
        plans = sweep_micro_batch(model, args.world, cluster, micro_batch, **fixed)
    else:
        plans = sweep(model, args.world, cluster, microbatches=microbatches, **fixed)
    ranked = best(plans, budget)
    print(
        f"# best of {_plural(len(plans), 'layout')} of {args.world} ranks ({len(ranked)} fit "
        f"in {budget / GIB:.1f} GiB per rank), fastest first"
    )
    for p in ranked[: args.top]:
        lay = p.layout
        print(
            f"layout={layout_name(lay)} m={lay.microbatches} "
            f"memory_gib={p.memory_per_rank / GIB:.2f} step_time_s={p.time.total_s:.4g} "
            f"bound={p.time.bound}"
        )
    if not ranked:
        print(_hint(plans, args, budget))
    if args.plot:
        from .plots import plot_sweep

        plot_sweep(plans, budget, highlight=chosen).savefig(args.plot, dpi=100, bbox_inches="tight")
        print(f"# wrote {args.plot}")
    return 0
