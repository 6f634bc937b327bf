"""`python -m minidist tour | bench NAME | plan ... | exercises [--check] | grade ... | site |
gpucheck`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minidist")
    sub = parser.add_subparsers(dest="command", required=True)

    tour = sub.add_parser("tour", help="run every technique on a local CPU world, print a table")
    tour.add_argument("--world-size", type=int, default=4)
    tour.add_argument("--out", default="minidist_tour", help="folder for the plots")
    tour.add_argument("--only", nargs="*", help="run only these rows (by name)")

    bench = sub.add_parser("bench", help="benchmark a technique against its torch equivalent")
    bench.add_argument("name", help="which benchmark, e.g. ddp")
    bench.add_argument("--world-size", type=int, default=2)
    bench.add_argument("--rounds", type=int, default=15)
    bench.add_argument("--steps", type=int, default=5, help="steps per timed round")

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
        "--out", default="build/site", help="output folder (a previous build is replaced)"
    )

    sub.add_parser("gpucheck", help="the checks that need a GPU (name=value lines)")

    args = parser.parse_args(argv)
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

        return run_tour(args.world_size, Path(args.out), args.only)
    if args.command == "bench":
        from .bench import run_bench

        return run_bench(args.name, args.world_size, args.rounds, args.steps)
    if args.command == "plan":
        from .planner.cli import run_plan

        return run_plan(args)
    from .course.exercises import generate, stale

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
