"""Helpers the mixed_precision checkers share."""

from __future__ import annotations

INF, NAN = float("inf"), float("nan")


def _and(worlds) -> str:
    """(2, 3, 4) -> "2, 3 and 4"."""
    names = [str(w) for w in worlds]
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]
