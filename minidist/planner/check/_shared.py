"""Helpers the planner checkers share."""

from __future__ import annotations


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
