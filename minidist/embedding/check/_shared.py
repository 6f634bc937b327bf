"""Helpers the embedding checkers share."""

from __future__ import annotations

import torch


def as_list(x) -> list:
    """A tensor, list or tuple of numbers as a list of Python ints (or floats)."""
    if isinstance(x, torch.Tensor):
        return x.tolist()
    return [v.item() if isinstance(v, torch.Tensor) else v for v in x]
