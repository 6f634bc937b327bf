"""Grade a learner's exercise notebooks: `python -m minidist grade NOTEBOOK... | --all DIR |
--class DIR`.

Each notebook runs headless in a fresh kernel (nbclient), every code cell in order, as a
learner's "Run all" would, except that an error does not stop the run: a wrong answer in
exercise 1 still lets exercise 2 be graded. Its exercises are those of the released
exercise notebook it answers, found by its exercises rather than its file name
(`exercises/` of this checkout, or `--released DIR`): each gets a row, PASS or FAIL with
the checker's message; a file that cannot be graded gets ERROR rows and grading goes on
(`grade_run`). Check cells run as released, and their verdict comes back on a pipe of the
grader's, not through what the kernel displays (`grade_kernel`); no process a notebook
started outlives its grading (`grade_reap`).

Two things would stop a plain "Run all" and do not stop the grader:

- a cell that runs past `--timeout` is interrupted (SIGINT, as the notebook's stop button)
  and reported; when the kernel does not answer the interrupt, the notebook's remaining
  exercises fail with that reason and grading moves on to the next notebook;
- a kernel that dies (a segfault, `os._exit`, out of memory) is reported for every
  exercise it did not reach, and the next notebook runs in a new kernel.

Exit status: 0 every exercise passed; 1 some exercise failed or could not be graded (the
table says which); 2 a usage error (one line on stderr, before anything runs) or nothing to
grade; 3 an internal error of the grader (a bug: its traceback on stderr; when it happened while
grading one notebook, that notebook gets an ERROR row and every other one is still graded).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

from . import grade_sandbox
from .grade_class import CSV_COLUMNS, grade_all, shown, students, totals, visible, write_csv
from .grade_match import CHECK_CALL, EXERCISE_HEADING, find_exercises
from .grade_run import Result, grade_one, unreadable

__all__ = ["CHECK_CALL", "EXERCISE_HEADING", "Result", "find_exercises", "grade_notebook"]
EXIT_PASSED, EXIT_FAILED, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
RELEASED = Path(__file__).resolve().parents[2] / "exercises"


class UsageError(ValueError):
    """A refused invocation: one line naming the argument and the rule."""


def default_released() -> Path | None:
    """The checkout's exercises/ (None for an installed package without one)."""
    return RELEASED if RELEASED.is_dir() else None


def grade_notebook(
    path: Path | str,
    timeout_s: float = 120.0,
    released: Path | None | str = "default",
    slack: float = 3.0,
    sandbox: dict | None = None,
) -> list[Result]:
    """Grade one notebook: one row per exercise (see the module's docstring)."""
    twins = default_released() if released == "default" else released
    return grade_one(Path(path), timeout_s, twins and Path(twins), slack, sandbox)[0]


def format_table(results: list[Result]) -> str:
    """The table `grade` prints: one row per exercise, then a one-line summary."""
    rows = [("notebook", "exercise", "result", "time", "message")]
    for r in results:
        where = f"{shown(r.student)}/{Path(r.notebook).name}" if r.student else r.notebook
        message = " ⏎ ".join(line.strip() for line in r.message.strip().splitlines())
        fields = (where, r.exercise, r.status, f"{r.seconds:.1f} s", message)
        rows.append(tuple(map(visible, fields)))  # no field can move the cursor or split a row
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[4] for row in rows]
    failed = sum(r.status == "FAIL" for r in results)
    errors = sum(r.status == "ERROR" for r in results)
    total = sum(r.seconds for r in results)
    passed = len(results) - failed - errors
    could_not = f", {errors} could not be graded" if errors else ""
    lines.append(
        f"{len(results)} exercises: {passed} passed, {failed} failed{could_not} "
        f"({total:.1f} s in check cells)"
    )
    return "\n".join(line.rstrip() for line in lines)


def _jobs(args) -> list[tuple[str, Path]]:
    """(student, notebook) pairs to grade, every argument checked first."""
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise UsageError(f"--timeout {args.timeout:g}: must be a number of seconds > 0")
    if not (math.isfinite(args.slack) and args.slack >= 1):
        raise UsageError(f"--slack {args.slack:g}: must be a factor >= 1")
    if args.jobs < 1:
        raise UsageError(f"-j {args.jobs}: must be >= 1 notebooks at a time")
    if args.released is not None and not Path(args.released).is_dir():
        raise UsageError(f"--released {args.released}: must be a folder of exercise notebooks")
    if args.class_dir is not None and (args.notebooks or args.all):
        raise UsageError("--class DIR grades a whole class: give no notebooks and no --all")
    jobs: list[tuple[str, Path]] = []
    for name in args.notebooks:
        path = Path(name)
        if path.is_dir():
            raise UsageError(f"{name}: is a folder; grade it with --all {name} (or --class)")
        if not path.is_file():
            raise UsageError(f"{name}: no such notebook")
        if path.suffix != ".ipynb":
            raise UsageError(f"{name}: must be a .ipynb notebook")
        jobs.append(("", path))
    if args.all is not None:
        folder = Path(args.all)
        if not folder.is_dir():
            raise UsageError(f"--all {args.all}: must be a folder of .ipynb notebooks")
        found = sorted(folder.glob("*.ipynb"))
        if not found:
            raise UsageError(f"--all {args.all}: the folder holds no .ipynb notebooks")
        jobs += [("", p) for p in found]
    if args.class_dir is not None:
        folder = Path(args.class_dir)
        if not folder.is_dir():
            raise UsageError(f"--class {args.class_dir}: must be a folder of student folders")
        found = students(folder)
        if not found:
            raise UsageError(f"--class {args.class_dir}: holds no student folders")
        jobs += [(who, p) for who, notebooks in found for p in notebooks or [folder / who]]
    if not jobs:
        raise UsageError("give notebooks to grade, --all DIR or --class DIR")
    _check_outputs(args, jobs)
    return jobs


def _within(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def _found_in(args, student: str, path: Path) -> Path | None:
    """The folder a notebook was found in by `--class` (its student's) or `--all`, whose
    files alone are the submission: None for a notebook named on the command line."""
    if student:
        return Path(args.class_dir) / student
    if args.all is not None and path.parent == Path(args.all):
        return Path(args.all)
    return None


FEEDBACK_KEY = "minidist_grade_feedback"  # in an executed copy's metadata: ours to replace


def _feedback_target(feedback: Path, student: str, path: Path) -> Path:
    return (feedback / student if student else feedback) / path.name


def _write_feedback(executed, target: Path) -> None:
    """The executed copy, marked as the grader's (a later run may replace it, and only it);
    a copy that cannot be written is a warning, never the end of the class."""
    import nbformat

    executed.metadata[FEEDBACK_KEY] = True
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(executed, target)
    except OSError as exc:
        print(
            f"warning: could not write the executed copy {visible(str(target))} ({exc})",
            file=sys.stderr,
        )


def _ours(path: Path, kind: str) -> bool:
    """Whether an existing file is one an earlier `grade` wrote (an executed copy carrying
    FEEDBACK_KEY, a CSV starting with its header), so that replacing it loses nothing."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            if kind == "csv":
                return f.readline().rstrip("\r\n") == ",".join(CSV_COLUMNS)
            return json.load(f).get("metadata", {}).get(FEEDBACK_KEY) is True
    except (OSError, ValueError, AttributeError):
        return False


def _check_outputs(args, jobs: list[tuple[str, Path]]) -> None:
    """--feedback and --csv are written only where they overwrite nothing that is graded
    (a submission is never replaced by its executed copy) and nothing of the user's (an
    existing file is replaced only when an earlier `grade` wrote it: an executed copy it
    marked, a CSV with its header), and only where they can be written, checked before the
    first notebook runs: a class graded for an hour must not end in a lost table."""
    sources = {p.resolve() for _, p in jobs if p.is_file()}
    targets: dict[Path, Path] = {}
    if args.feedback is not None:
        feedback = Path(args.feedback).resolve()
        if feedback.exists() and not feedback.is_dir():
            raise UsageError(f"--feedback {args.feedback}: exists and is not a folder")
        if args.class_dir is not None:
            klass = Path(args.class_dir).resolve()
            if _within(feedback, klass) or _within(klass, feedback):
                how = "is" if feedback == klass else "lies inside"
                how = "holds" if feedback != klass and _within(klass, feedback) else how
                raise UsageError(
                    f"--feedback {args.feedback}: {how} the class folder {args.class_dir}; "
                    "the executed copies would overwrite or mix with the submissions: "
                    "give a folder outside it"
                )
        for student, path in jobs:
            target = _feedback_target(feedback, student, path).resolve()
            if target in sources:
                raise UsageError(
                    f"--feedback {args.feedback}: would overwrite the graded notebook "
                    f"{path} with its executed copy; give another folder"
                )
            if target in targets and path.is_file():
                raise UsageError(
                    f"--feedback {args.feedback}: {targets[target]} and {path} would both be "
                    f"written to {target}; grade them with separate --feedback folders"
                )
            blocked = next((p for p in target.parents if p.exists() and not p.is_dir()), None)
            if blocked is not None:
                raise UsageError(
                    f"--feedback {args.feedback}: {blocked} is a file where the executed "
                    f"copy of {path} needs a folder; give another folder"
                )
            if path.is_file() and (target.is_dir() or target.exists() and not _ours(target, "")):
                raise UsageError(
                    f"--feedback {args.feedback}: {target} exists and is no executed copy "
                    f"an earlier grade wrote; the copy of {path} would replace it: move it "
                    "away or give another folder"
                )
            targets[target] = path
        _writable("--feedback", args.feedback, feedback)
    if args.csv is not None:
        table = Path(args.csv).resolve()
        if table.is_dir():
            raise UsageError(f"--csv {args.csv}: is a folder; give a file name")
        if table in sources:
            raise UsageError(f"--csv {args.csv}: is a notebook being graded")
        if table in targets:
            raise UsageError(
                f"--csv {args.csv}: is where --feedback writes the executed copy of "
                f"{targets[table]}; give another file name"
            )
        if not table.parent.is_dir():
            raise UsageError(f"--csv {args.csv}: the folder {table.parent} does not exist")
        if table.exists() and not _ours(table, "csv"):
            raise UsageError(
                f"--csv {args.csv}: exists and is no table an earlier grade wrote (its first "
                f"line is not {','.join(CSV_COLUMNS)}); move it away or give another name"
            )
        _writable("--csv", args.csv, table if table.exists() else table.parent)


def _writable(option: str, given: str, path: Path) -> None:
    """`path`, or the nearest folder above it that exists, can be written."""
    here = next(p for p in [path, *path.parents] if p.exists())
    if not os.access(here, os.W_OK | (os.X_OK if here.is_dir() else 0)):
        raise UsageError(f"{option} {given}: cannot be written ({here} is not writable)")


def _grader(args, released: Path | None, sandbox: dict | None, failed: list[Path]):
    """grade(student, notebook) -> rows; a notebook the grader fails on is appended to
    `failed` and gets an ERROR row. A checker module changed after this call (by any
    notebook graded since, say one that planted a fake checker with an old date for the
    next students) fails the checks that load it."""
    since = time.time()

    def grade(student: str, path: Path) -> list[Result]:
        if path.is_dir() and path.suffix != ".ipynb":  # a student with no notebooks
            why = f"no .ipynb notebooks in {path}"
            return [Result("", "(no notebooks)", "ERROR", why, 0.0, student)]
        folder = _found_in(args, student, path)
        if folder is not None and not _within(path.resolve(), folder.resolve()):
            why = (
                f"it is a link to {path.resolve()}, outside {folder}: only the submission's "
                "own files are graded"
            )
            return unreadable(path, [], why, student)
        try:
            rows, executed = grade_one(
                path, args.timeout, released, args.slack, sandbox, student, since
            )
        except Exception as exc:  # one notebook never stops the class: ERROR rows, go on
            failed.append(path)
            print(
                f"minidist grade: internal error grading {visible(str(path))} (a bug in the "
                "grader; grading goes on):",
                file=sys.stderr,
            )
            traceback.print_exc()
            why = f"the grader failed on it ({type(exc).__name__}: {exc})"
            return unreadable(path, [], why, student)
        if not rows:
            print(
                f"warning: {visible(str(path))} holds no exercises (no check cell): nothing graded",
                file=sys.stderr,
            )
        if executed is not None and args.feedback is not None:
            _write_feedback(executed, _feedback_target(Path(args.feedback), student, path))
        return rows

    return grade


def run_grade(args) -> int:
    """The CLI (arguments from `minidist.__main__`); returns the exit status."""
    try:
        jobs = _jobs(args)
        released = Path(args.released) if args.released else default_released()
        sandbox = None
        if args.sandbox:
            problem = grade_sandbox.bwrap_problem()
            if problem:
                raise UsageError(problem)
            hide = [Path.home()] + ([Path(args.class_dir).resolve()] if args.class_dir else [])
            sandbox = {"hide": hide}
    except UsageError as exc:
        print(f"minidist grade: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    results: list[Result] = []
    failed: list[Path] = []
    try:
        results = grade_all(jobs, _grader(args, released, sandbox, failed), args.jobs)
    except Exception:
        _report(results, args)
        print("minidist grade: internal error (a bug in the grader):", file=sys.stderr)
        traceback.print_exc()
        return EXIT_INTERNAL
    _report(results, args)
    if failed:
        return EXIT_INTERNAL
    if not results:
        print("minidist grade: warning: no exercises found: nothing graded", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_PASSED if all(r.passed for r in results) else EXIT_FAILED


def _report(results: list[Result], args) -> None:
    if args.csv is not None:
        write_csv(results, Path(args.csv))
        print(f"wrote {args.csv}", file=sys.stderr)
    if args.json:
        print(json.dumps([{**asdict(r), "passed": r.passed} for r in results], indent=1))
        return
    print(format_table(results))
    if args.class_dir is not None and results:
        print(totals(results))


def add_arguments(parser) -> None:
    """`grade`'s arguments (`minidist.__main__` builds the parser)."""
    parser.add_argument("notebooks", nargs="*", help="exercise notebooks to grade")
    parser.add_argument("--all", metavar="DIR", help="grade every DIR/*.ipynb")
    parser.add_argument(
        "--class",
        dest="class_dir",
        metavar="DIR",
        help="grade a class: each subfolder of DIR is a student",
    )
    parser.add_argument("--csv", metavar="FILE", help="also write the rows as CSV")
    parser.add_argument("--feedback", metavar="DIR", help="write each executed notebook here")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="notebooks at a time")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per cell")
    parser.add_argument(
        "--slack",
        type=float,
        default=3.0,
        help="the checkers' own time limits x this (a loaded machine)",
    )
    parser.add_argument(
        "--released", metavar="DIR", help="the released exercise notebooks (default: exercises/)"
    )
    parser.add_argument(
        "--sandbox",
        action="store_true",
        help="each kernel under bubblewrap: no network, read-only files",
    )
    parser.add_argument("--json", action="store_true", help="JSON instead of the table")
