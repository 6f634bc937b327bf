"""`python -m minidist tour | bench NAME | plan ... | train ... | plot-run LOG |
exercises [--check] | grade ... | site | gpucheck`."""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path

from .cli_checks import notebook_folder, positive_int, writable_file, writable_folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minidist")
    sub = parser.add_subparsers(dest="command", required=True)

    tour = sub.add_parser("tour", help="run every technique on a local CPU world, print a table")
    tour.add_argument("--world-size", type=positive_int, default=4)
    tour.add_argument("--out", default="minidist_tour", help="folder for the plots")
    tour.add_argument("--only", nargs="*", help="run only these rows (by name)")

    bench = sub.add_parser("bench", help="benchmark a technique against its torch equivalent")
    bench.add_argument("name", help="which benchmark, e.g. ddp")
    bench.add_argument("--world-size", type=positive_int, default=2)
    bench.add_argument("--rounds", type=positive_int, default=15)
    bench.add_argument("--steps", type=positive_int, default=5, help="steps per timed round")
    for size in ("--hidden", "--seq-len", "--layers"):
        bench.add_argument(size, type=positive_int, help="the model's size (benches that take it)")

    plan = sub.add_parser("plan", help="predict memory, bytes and step time of a layout")
    from .planner.cli import add_arguments

    add_arguments(plan)

    ex = sub.add_parser("exercises", help="generate exercises/ from solutions/")
    ex.add_argument("--solutions", default="solutions")
    ex.add_argument("--exercises", default="exercises")
    ex.add_argument("--check", action="store_true", help="only report stale notebooks")

    grade = sub.add_parser("grade", help="run exercise notebooks headless, PASS/FAIL per exercise")
    from .course.grade import add_arguments as grade_arguments

    grade_arguments(grade)

    site = sub.add_parser("site", help="build the course website from notebooks/")
    site.add_argument(
        "--out",
        default="build/site",
        help="output folder (a previous build's files are replaced; others stay)",
    )

    sub.add_parser("gpucheck", help="the checks that need a GPU (name=value lines)")

    train = sub.add_parser("train", help="train one layout of every parallelism (lessons 17, 18)")
    from .trainer.cli import add_arguments as add_train_arguments

    add_train_arguments(train)

    plot_run = sub.add_parser("plot-run", help="draw a train --log file into a PNG")
    plot_run.add_argument("log", help="the JSONL file of python -m minidist train --log")
    plot_run.add_argument("--out", help="the PNG to write (default: LOG with .png)")

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["plan"]:
        from .trainer.plan import run_composed_plan, wanted

        if wanted(argv[1:]):  # a `train` run's options: lesson 17's plan of that run
            return run_composed_plan(argv[1:])
    if argv[:1] == ["train"]:  # a --config file's options first, the command line after
        from .trainer.options import config_argv

        try:
            argv = ["train", *config_argv(train, argv[1:])]
        except ValueError as e:
            train.error(str(e))
    args = parser.parse_args(argv)
    if args.command == "train":
        from .trainer.cli import check_run, run_train

        try:  # bad options: one line, exit 2, before any rank starts
            check_run(args)
        except ValueError as e:
            train.error(str(e))
        return run_train(args)
    if args.command == "plot-run":
        from .trainer.plots import plot_run as draw
        from .trainer.plots import read_log

        out = Path(args.out or Path(args.log).with_suffix(".png"))
        if why := writable_file(out):
            plot_run.error(f"argument --out: {why}")
        try:
            records = read_log(args.log)
        except (OSError, ValueError, KeyError) as e:
            plot_run.error(f"argument log: {args.log} is not a train --log file ({e})")
        if not records:
            plot_run.error(f"argument log: {args.log} holds no step")
        draw(records).savefig(out, dpi=110)
        print(f"wrote {out}")
        return 0
    if args.command == "gpucheck":
        from .gpucheck import main as gpucheck

        return gpucheck()
    if args.command == "grade":
        from .course.grade import run_grade

        return run_grade(args)
    if args.command == "site":
        from .course.site import run_site

        return run_site(Path("."), Path(args.out))
    if args.command == "tour":
        from .tour import run_tour

        if why := writable_folder(Path(args.out)):
            tour.error(f"argument --out: {why}")
        from .registry import tour_rows

        if unknown := sorted(set(args.only or []) - set(tour_rows())):
            tour.error(f"argument --only: unknown rows {unknown}; choose from {list(tour_rows())}")

        return run_tour(args.world_size, Path(args.out), args.only)
    if args.command == "bench":
        from .bench import run_bench
        from .registry import benches

        if args.name not in benches():
            bench.error(
                f"argument name: unknown bench {args.name!r}; choose one of {sorted(benches())}"
            )
        sizes = {k: getattr(args, k) for k in ("hidden", "seq_len", "layers")}
        sizes = {k: v for k, v in sizes.items() if v is not None}
        taken = inspect.signature(benches()[args.name]).parameters
        if untaken := [k for k in sizes if k not in taken]:
            flag = "--" + untaken[0].replace("_", "-")
            bench.error(f"argument {flag}: bench {args.name} has no model size to set")
        try:  # the bench checks its sizes and layout before any rank starts
            return run_bench(args.name, args.world_size, args.rounds, args.steps, **sizes)
        except ValueError as e:
            bench.error(str(e))
    if args.command == "plan":
        from .planner.cli import run_plan

        return run_plan(args)
    from .course.exercises import generate, stale

    if why := notebook_folder(Path(args.solutions)):
        ex.error(f"argument --solutions: {why}")
    if why := writable_folder(Path(args.exercises)):
        ex.error(f"argument --exercises: {why}")
    if args.check:
        out = stale(args.solutions, args.exercises)
        for path in out:
            print(f"stale: {path} (run: python -m minidist exercises)")
        return 1 if out else 0
    for path in generate(args.solutions, args.exercises):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
