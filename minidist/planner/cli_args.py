"""The options of `python -m minidist plan`, each checked when it is parsed.

Every rule is an argparse `type` (one option: "argument --world: ...") or, for rules that
join options, `validate` (`parser.error`: the same usage line and exit status 2), so a bad
value never reaches the planner. Counts accept integral floats as well ("--params 7.5e9",
"--world 1e3").
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

from ..cli_checks import writable_file
from ..pipeline.schedules import KINDS
from .hardware import CLUSTERS
from .spec import MAX_LAYERS, OFFLOAD, OPTIMIZERS, PRECISIONS, ModelSpec

MAX_COUNT = 10**21  # ranks, sequences, parameters: far beyond any machine; the sweep factors
# the world (`divisors.py`) in under a second up to here
MODEL_FIELDS = {
    "layers": f"transformer blocks (at most {MAX_LAYERS})",
    "hidden": "hidden size h",
    "heads": "attention heads a (must divide h)",
    "vocab": "vocabulary size V",
    "seq": "sequence length s",
}
REDUCE_DTYPES = ("fp32", "bf16")


def count(text: str, minimum: int = 1) -> int:
    """An integer >= `minimum` (given as 8, or as an integral float such as 1e3)."""
    try:
        value = float(text) if any(c in text for c in ".eE") else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
        value = int(value)
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{text} must be >= {minimum}")
    if value > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{text} is more than 10^21")
    return value


def positive(text: str) -> float:
    """A finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be a finite number > 0")
    return value


def params(text: str) -> int:
    """A parameter count: finite, >= 1, rounded to a whole number."""
    value = positive(text)
    if value < 1 or value > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{text} must be between 1 and 10^21 parameters")
    return int(round(value))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options; defaults are printed once, by the help strings' own %(default)s."""
    parser.set_defaults(plan_parser=parser)
    parser.epilog = (
        "With --model (or --config, --dp-shard, --dp-replicate), plan takes the options of "
        "python -m minidist train instead and prints lesson 17's plan of that run."
    )
    model = parser.add_argument_group("model: a GPT configuration, or --params alone")
    model.add_argument(
        "--params",
        type=params,
        help="parameter count (e.g. 7.5e9): then only model states "
        "and data-parallel bytes are planned; activations, tp and pp need the configuration",
    )
    for name, what in MODEL_FIELDS.items():
        model.add_argument(f"--{name}", type=count, help=what)
    model.add_argument(
        "--experts",
        type=lambda text: count(text, 0),
        default=0,
        help="experts E: every MLP a mixture of E experts (lesson 16; default 0, dense)",
    )
    model.add_argument("--top-k", type=count, default=1, help="experts per token (default 1)")
    model.add_argument(
        "--capacity-factor",
        type=positive,
        default=1.0,
        help="capacity C = ⌈factor · tokens · k / E⌉ per expert and rank (default 1.0)",
    )
    lay = parser.add_argument_group("layout")
    lay.add_argument("--world", type=count, required=True, help="ranks (devices) in all")
    lay.add_argument(
        "--tp", type=count, default=1, help="tensor-parallel size t (lesson 07; default 1)"
    )
    lay.add_argument("--pp", type=count, default=1, help="pipeline stages p (lesson 09; default 1)")
    lay.add_argument(
        "--sp",
        action="store_true",
        help="sequence parallelism in the tp group (lesson 14; needs --tp > 1, --pp 1)",
    )
    lay.add_argument(
        "--cp",
        type=count,
        default=1,
        help="context-parallel size c (lesson 15, ring attention; with DDP only; default 1)",
    )
    lay.add_argument("--dp", type=count, help="data-parallel size d (default: world / (t·p·c))")
    lay.add_argument(
        "--ep",
        type=count,
        default=1,
        help="expert-parallel size e, a divisor of d (lesson 16; needs --experts; default 1)",
    )
    lay.add_argument(
        "--zero",
        type=int,
        default=0,
        choices=(0, 1, 2, 3),
        help="ZeRO stage over dp: 0 = DDP, 1-2 (lesson 02), 3 = FSDP (lesson 03); default 0",
    )
    lay.add_argument("--shard-size", type=count, help="FSDP hybrid shard group (--zero 3)")
    lay.add_argument(
        "--micro-batch",
        type=count,
        help="sequences per micro-batch; every layout runs global batch / (d · this) of them "
        "(Megatron-LM's convention; default 1 unless --microbatches is given)",
    )
    lay.add_argument("--microbatches", type=count, help="micro-batches per step, fixed")
    lay.add_argument(
        "--schedule", default="1f1b", choices=KINDS, help="pipeline schedule (default 1f1b)"
    )
    lay.add_argument(
        "--virtual",
        type=count,
        default=1,
        help="model chunks per rank, only with --schedule interleaved (default 1)",
    )
    lay.add_argument(
        "--precision",
        default="mixed",
        choices=PRECISIONS,
        help="mixed (default): 16-bit parameters, gradients and activations, fp32 masters "
        "(ZeRO's 2+2+12 bytes per parameter); fp32: everything in float32",
    )
    lay.add_argument(
        "--reduce-dtype",
        choices=REDUCE_DTYPES,
        help="dtype the data-parallel collectives reduce gradients in: fp32 (default, as the "
        "course's MixedPrecision(reduce_dtype=torch.float32)) or bf16, the 16-bit compute "
        "type, half the bytes (needs --precision mixed)",
    )
    lay.add_argument(
        "--optimizer",
        default="adam",
        choices=OPTIMIZERS,
        help="adam (default): two fp32 moments per parameter (ZeRO's K = 12 with fp32 masters; "
        "needed for --zero 1-3); sgd: with momentum, one fp32 buffer",
    )
    lay.add_argument("--recompute", action="store_true", help="full recomputation (lesson 06)")
    lay.add_argument(
        "--offload",
        default="device",
        choices=OFFLOAD,
        help="where FSDP's optimizer runs and keeps its state (lesson 05; default device)",
    )
    lay.add_argument(
        "--global-batch", type=count, help="sequences per step (default: world × micro-batch)"
    )
    where = parser.add_argument_group("where it runs")
    clusters = "; ".join(f"{name}: {c.device.name}" for name, c in sorted(CLUSTERS.items()))
    where.add_argument(
        "--cluster",
        default="dgx-h100",
        choices=sorted(CLUSTERS),
        help=f"the devices, their memory and links (datasheet figures, minidist/planner/"
        f"hardware.py): {clusters} (default dgx-h100)",
    )
    where.add_argument(
        "--memory-gib", type=positive, help="memory budget per rank (default: the device's)"
    )
    where.add_argument("--top", type=count, default=5, help="best layouts to list (default 5)")
    where.add_argument("--plot", help="save the sweep plot (memory vs step time) to this file")


def model_spec(args) -> ModelSpec:
    """The `ModelSpec` the options describe; `parser.error` if they describe none."""
    parser = args.plan_parser
    given = [n for n in MODEL_FIELDS if getattr(args, n) is not None]
    if args.params is not None:
        if given:
            parser.error(
                f"give --params or the configuration, not both (--params with "
                f"{', '.join('--' + n for n in given)})"
            )
        if args.experts:
            parser.error(
                f"--experts {args.experts} needs the configuration (--layers --hidden "
                "--heads --vocab --seq), not --params"
            )
        return ModelSpec(params=args.params)
    missing = [n for n in MODEL_FIELDS if n not in given]
    if missing:
        parser.error(
            "give --params, or all of --layers --hidden --heads --vocab --seq (missing: "
            f"{', '.join('--' + m for m in missing)})"
        )
    try:
        moe = dict(experts=args.experts, top_k=args.top_k, capacity_factor=args.capacity_factor)
        return ModelSpec(args.layers, args.hidden, args.heads, args.vocab, args.seq, **moe)
    except ValueError as err:
        fields = "|".join([*MODEL_FIELDS, "experts", "top_k", "capacity_factor"])
        named = re.sub(
            rf"\b({fields})=",
            lambda m: "--" + m[1].replace("_", "-") + " ",
            str(err).replace("ModelSpec: ", ""),
        )
        parser.error(named)  # the options named: layers=4 -> --layers 4


def validate(args) -> None:
    """The rules that join options (argparse's format, exit status 2)."""
    error = args.plan_parser.error
    if args.plot and (why := writable_file(Path(args.plot))):
        error(f"argument --plot: {why}")
    if args.virtual != 1 and args.schedule != "interleaved":
        error(
            f"--virtual {args.virtual} needs --schedule interleaved: {args.schedule} runs one "
            "model chunk per rank"
        )
    if args.reduce_dtype == "bf16" and args.precision != "mixed":
        error("--reduce-dtype bf16 needs --precision mixed (fp32 training reduces in fp32)")
    if args.sp and args.tp == 1:
        error(
            "--sp needs --tp > 1: sequence parallelism splits the tensor-parallel group's "
            "replicated parts along the sequence"
        )
    if args.sp and args.pp > 1:
        error(
            f"--sp with --pp {args.pp}: lesson 14 runs sequence parallelism without a pipeline "
            "(with --model, plan takes lesson 17's composed layouts)"
        )
    if args.cp > 1 and (args.tp > 1 or args.pp > 1 or args.zero != 0):
        error(
            f"--cp {args.cp} with --tp {args.tp} --pp {args.pp} --zero {args.zero}: lesson 15 "
            "composes context parallelism with DDP (--zero 0) only (with --model, plan takes "
            "lesson 17's composed layouts)"
        )
    split = args.tp * args.pp * args.cp
    if args.dp is None and args.world % split:
        error(
            f"--world {args.world} is not divisible by --tp {args.tp} × --pp {args.pp} × "
            f"--cp {args.cp}"
        )
    dp = dp_size(args)
    if dp * split != args.world:
        error(
            f"--dp {dp} × --tp {args.tp} × --pp {args.pp} × --cp {args.cp} = {dp * split} "
            f"ranks, not --world {args.world}"
        )
    if args.shard_size is not None and (args.zero != 3 or dp % args.shard_size):
        error(f"--shard-size {args.shard_size} needs --zero 3 and must divide dp = {dp}")


def dp_size(args) -> int:
    """--dp, or what the world leaves after tp × pp × cp."""
    return args.dp if args.dp is not None else args.world // (args.tp * args.pp * args.cp)


def layout_error(args, err: ValueError) -> None:
    """A `Layout` refused the options: argparse's format."""
    args.plan_parser.error(str(err).replace("Layout: ", ""))
