"""Calling a learner's function from a pure (no-world) checker: a crash becomes a message.

`learner_call(fn, *args, call=..., hints=...)` calls `fn(*args)` under a time limit. A
`NotImplementedError` (the exercise's stub) goes through as itself; any other exception
becomes a `CheckFailed` that says what the learner's code raised, where (the learner's own
line, not the checker's) and, from `hints` ({exception type name or message fragment:
likely cause}), the likely cause in the exercise's terms. A call that runs longer than
`limit_s` (an endless probe loop, say) fails the same way instead of hanging the check.
Lessons 10-12 use it too; the time limit is the course's (`course.failures.time_limit`).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..course.check import CheckFailed, fail
from ..course.failures import _LearnerTimeout, limit_words, time_limit

PACKAGE = Path(__file__).resolve().parent.parent  # minidist/
LIMIT_S = 2.0  # a right answer takes microseconds


def where_raised(exc: BaseException) -> str:
    """The innermost frame of the traceback outside minidist/ (the learner's line)."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if not Path(f.filename).resolve().is_relative_to(PACKAGE)]
    frame = (own or frames or [None])[-1]
    if frame is None:
        return ""
    line = f": `{frame.line.strip()}`" if frame.line else ""
    return f" at line {frame.lineno} of your code{line}"


def learner_call(
    fn: Callable,
    *args: Any,
    call: str = "",
    hints: dict[str, str] | None = None,
    limit_s: float = LIMIT_S,
    expect: type[BaseException] | tuple = (),
    **kwargs: Any,
) -> Any:
    """`fn(*args, **kwargs)`; a crash or a run past `limit_s` is reported as a CheckFailed.

    `call` names the call in the message ("insert(table, 7)"); `hints` maps an exception
    type name ("IndexError") or a fragment of its message to the likely cause; `expect`:
    exceptions the exercise asks for here, raised as they are.
    """
    try:
        with time_limit(limit_s):
            return fn(*args, **kwargs)
    except (NotImplementedError, CheckFailed):
        raise
    except expect:
        raise
    except _LearnerTimeout as stop:
        cause = (hints or {}).get("LearnerTimeout", "a loop that never ends")
        fail(
            f"{call or fn.__name__} was still running after {limit_words(limit_s, stop)} "
            f"(a right answer takes microseconds): likely {cause}."
        )
    except Exception as exc:  # noqa: BLE001 (the learner's crash is the diagnosis)
        name, text = type(exc).__name__, str(exc).splitlines()[0][:160] if str(exc) else ""
        cause = next(
            (h for key, h in (hints or {}).items() if key == name or (key in text and key)),
            None,
        )
        fail(
            f"{call or fn.__name__} raised {name}({text!r}){where_raised(exc)}."
            + (f" Likely cause: {cause}" if cause else "")
        )
