"""The trainer's options beyond lesson 17's and 18's, a TOML configuration, and the checks
that run in the parent before any rank starts.

`--config run.toml`: keys are the command's option names without the dashes (`lr = 3e-4`,
`global-batch = 32`, `data = "input.txt"`; `global_batch` also works), values TOML's
scalars; a flag is `sp = true`; `betas = [0.9, 0.95]` (or `"0.9,0.95"`). The file is read
first and the command line after it, so an option given on the command line wins. An
unknown key is refused, naming it. Python 3.10 has no `tomllib`: the `tomli` package is
used when installed, else `--config` is refused.

`resolved_toml(args)` is the run's whole configuration as TOML (what is printed at the
start and saved beside the checkpoint): given back with `--config`, it repeats the run.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from ..cli_checks import positive_int
from ..compose.optim import LR_SCHEDULES, OPTIMIZERS, OptimizerConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The trainer's options (the model's sizes, the optimizer, data, evaluation, weights in
    and out, the configuration file)."""
    p.add_argument("--config", help="TOML file of options (the command line wins)")
    sizes = p.add_argument_group("model sizes (built-in models; default lesson 17's)")
    for name in ("hidden", "heads", "kv-heads", "seq-len", "vocab", "ffn"):
        sizes.add_argument(f"--{name}", type=positive_int)
    opt = p.add_argument_group("optimizer")
    opt.add_argument("--optimizer", choices=OPTIMIZERS, default="adam")
    opt.add_argument("--lr", type=float, default=1e-2, help="peak learning rate")
    opt.add_argument("--weight-decay", type=float, default=0.0, help="on ndim >= 2 only")
    opt.add_argument("--warmup", type=int, default=0, help="steps of linear warm-up")
    opt.add_argument("--lr-schedule", choices=LR_SCHEDULES, default="constant")
    opt.add_argument("--min-lr", type=float, default=0.0, help="the decay's end")
    opt.add_argument("--clip-grad", type=float, help="clip the global gradient norm to this")
    opt.add_argument(
        "--betas",
        type=betas,
        default=(0.9, 0.999),
        metavar="B1,B2",
        help="Adam's moment decays (default 0.9,0.999)",
    )
    opt.add_argument("--eps", type=float, default=1e-8, help="Adam's epsilon (default 1e-8)")
    data = p.add_argument_group("data")
    data.add_argument("--data", help="text file or folder, token .bin (uint16) or .npz")
    data.add_argument("--tokenizer", help="a tokenizers JSON file (default: bytes)")
    data.add_argument("--eval-every", type=int, default=0, help="steps between evaluations")
    data.add_argument("--eval-batches", type=positive_int, default=1, help="held-out batches")
    data.add_argument("--seed", type=int, default=0, help="the model's initialisation")
    hf = p.add_argument_group("Hugging Face weights")
    hf.add_argument("--init-from-hf", help="a save_pretrained folder to start from")
    hf.add_argument("--export-hf", help="write the trained weights here (a new folder)")
    moe = p.add_argument_group("DeepSeek-V3 (lesson 19)")
    moe.add_argument(
        "--moe-bias-update-speed",
        type=float,
        default=0.0,
        metavar="GAMMA",
        help="after each step, each routing bias -= GAMMA·sign(load − mean load) "
        "(DeepSeek-V3 §2.1.2; 0: off)",
    )


def betas(text: str) -> tuple[float, float]:
    """argparse type of --betas: two numbers B1,B2 (their range is `OptimizerConfig.check`'s)."""
    try:
        b1, b2 = (float(b) for b in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not two numbers B1,B2") from None
    return b1, b2


def optimizer_config(args) -> OptimizerConfig:
    return OptimizerConfig(
        args.optimizer,
        args.lr,
        args.weight_decay,
        betas=args.betas,
        eps=args.eps,
        warmup=args.warmup,
        lr_schedule=args.lr_schedule,
        min_lr=args.min_lr,
        clip_grad=args.clip_grad,
    ).check(args.steps)


def _read_toml(path: str) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise ValueError(
                f"--config {path}: reading TOML needs Python >= 3.11 or the tomli package"
            ) from None
    if Path(path).exists() and not Path(path).is_dir() and not Path(path).is_file():
        raise ValueError(f"--config {path}: not a regular file (a FIFO or device is never read)")
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ValueError(f"--config {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"--config {path}: not TOML ({e})") from None
    except UnicodeDecodeError as e:  # TOML is UTF-8 text
        raise ValueError(f"--config {path}: not TOML (not UTF-8 text: {e.reason})") from None


def config_argv(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`argv` with the `--config` file's options put first (so the command line wins)."""
    pre = argparse.ArgumentParser(prog=parser.prog, add_help=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    if known.config is None:
        return argv
    actions = {a.dest: a for a in parser._actions if a.option_strings}
    for a in parser._actions:  # an option's other long names too (log-jsonl for log)
        for name in a.option_strings:
            if name.startswith("--"):
                actions.setdefault(name[2:].replace("-", "_"), a)
    out = []
    for key, value in _read_toml(known.config).items():
        dest = key.replace("-", "_")
        if dest not in actions or actions[dest].dest in ("config", "help"):
            raise ValueError(
                f"--config {known.config}: unknown key {key!r} (keys are the "
                "options' names, e.g. lr, global-batch)"
            )
        action, option = actions[dest], actions[dest].option_strings[0]
        if isinstance(action, argparse._StoreTrueAction):
            if not isinstance(value, bool):
                raise ValueError(
                    f"--config {known.config}: {key} = {value!r} must be true or false"
                )
            out += [option] if value else []
        elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
            out += [option, str(value)]
        elif dest == "betas" and isinstance(value, list):  # betas = [0.9, 0.95]
            out += [option, ",".join(str(v) for v in value)]
        else:
            raise ValueError(
                f"--config {known.config}: {key} = {value!r} must be a string or a number"
            )
    return out + argv


def resolved_toml(args: argparse.Namespace) -> str:
    """Every option's value as TOML (None left out), keys in the options' spelling."""
    lines = []
    for dest, value in sorted(vars(args).items()):
        if value is None or dest in ("command", "config"):
            continue
        key = dest.replace("_", "-")
        if isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        elif isinstance(value, (int, float)):
            lines.append(f"{key} = {value!r}")
        elif isinstance(value, tuple):  # --betas
            lines.append(f"{key} = [{', '.join(repr(v) for v in value)}]")
        else:
            text = str(value).replace("\\", "\\\\").replace('"', '\\"')
            lines.append(f'{key} = "{text}"')
    return "\n".join(lines) + "\n"


def config_path(save: str) -> Path:
    """Where the resolved configuration is saved beside checkpoint `save`."""
    return Path(save).with_name(Path(save).name + ".config.toml")


# The first line of a configuration `train` saved: what it may replace at a later save.
SAVED_BY = "# the resolved options of python -m minidist train (--config of it repeats the run)"


def check_config_path(save: str) -> None:
    """ValueError where `config_path(save)` is a user's file or folder, not a configuration
    `train` saved (never overwritten)."""
    path = config_path(save)
    if not path.exists() and not path.is_symlink():
        return
    first = b""
    if path.is_file() and not path.is_symlink():
        with open(path, "rb") as f:
            first = f.readline(len(SAVED_BY) + 2)
    if first.rstrip(b"\r\n") != SAVED_BY.encode():
        raise ValueError(
            f"--save {save}: {path} is in the way (the run's configuration is saved there) "
            "and was not written by train: never overwritten; save into another folder"
        )


def save_config(save: str, resolved: str) -> None:
    """The resolved configuration beside checkpoint `save`, written whole or not at all."""
    path = config_path(save)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's is 0600: the file as open() makes it
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"{SAVED_BY}\n{resolved}")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
