"""Helpers the megatron checkers share."""

from __future__ import annotations


def _and(items) -> str:
    names = [str(i) for i in items]
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]
