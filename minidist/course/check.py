"""What every exercise checker shares: run the learner's code, explain what went wrong.

A checker calls the learner's function (on a world of real processes when it needs one),
compares with the reference, and either prints one line saying what passed or raises
`CheckFailed` whose message names the most likely mistake. A stub that still raises
`NotImplementedError` is re-raised as such, on a rank or not, so an untouched exercise
says "not implemented yet" rather than "wrong".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..runtime import RankFailedError, launch


class CheckFailed(AssertionError):
    """The learner's code ran but gave a wrong answer; the message says what to look at."""


def run_on_world(fn: Callable, world_size: int, *args: Any, timeout_s: float = 60) -> list:
    """`launch`, with a learner's NotImplementedError on any rank surfaced as itself."""
    try:
        return launch(fn, world_size, *args, timeout_s=timeout_s)
    except RankFailedError as exc:
        if "NotImplementedError" in str(exc):
            raise NotImplementedError(
                f"the exercise is not implemented yet (rank {exc.rank} reached the stub)"
            ) from None
        raise


def passed(message: str) -> None:
    print(f"PASSED: {message}")


def fail(message: str) -> None:
    raise CheckFailed(message)
