"""Helpers the planner checkers share: numbers compared, and the learner's function called so
that anything it raises becomes a checker message (what, where, the likely cause), not a
traceback."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path

from ...course.check import fail

PACKAGE = Path(__file__).resolve().parents[2]  # minidist/


def _and(items) -> str:
    """(2, 3, 4) -> "2, 3 and 4"."""
    names = [str(i) for i in items]
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]


def _same(a: float, b: float) -> bool:
    """Equal up to float rounding (the formulas are exact; only the order of terms differs)."""
    return abs(a - b) <= 1e-9 * max(1.0, abs(b))


def _number(value) -> float | None:
    """`value` as a float, or None when it is not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        try:
            return float(value.item())  # a 0-d tensor or numpy scalar
        except (AttributeError, TypeError, ValueError, RuntimeError):
            return None
    return float(value)


def _in_package(filename: str) -> bool:
    """A file of minidist itself (by its place, not by a folder's name: a checkout is often
    called `minidist` too, and the learner's own files may lie in it)."""
    return Path(filename).resolve().is_relative_to(PACKAGE)


def _where(exc: BaseException) -> str:
    """The innermost frame of the learner's code (not minidist's, torch's or Python's)."""
    frames = traceback.extract_tb(exc.__traceback__)[1:]  # [0] is call_learner itself
    mine = [
        f
        for f in frames
        if "site-packages" not in f.filename
        and not _in_package(f.filename)
        and "/lib/python" not in f.filename
    ]
    frame = (mine or frames or [None])[-1]
    if frame is None:
        return ""
    code = f": `{frame.line.strip()}`" if frame.line else ""
    inside = "" if frame in mine else " (inside a library call your code made)"
    return f" at line {frame.lineno} of {frame.name}{code}{inside}"


def call_learner(fn: Callable, call: str, hints: dict[type, str], *args):
    """`fn(*args)`; a NotImplementedError (the stub) passes through, anything else the
    learner's code raises fails the check naming the call, the exception, the line, and the
    exercise's likely cause for that kind of exception (`hints`, by exception class)."""
    try:
        return fn(*args)
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 (the learner's code: any exception is a finding)
        hint = next((h for kind, h in hints.items() if isinstance(exc, kind)), "")
        fail(
            f"{call} raised {type(exc).__name__}: {exc}{_where(exc)}. "
            + (
                hint
                or "Read the exercise's rule again for this case; the checker passes its "
                "arguments exactly as the exercise describes them."
            )
        )
