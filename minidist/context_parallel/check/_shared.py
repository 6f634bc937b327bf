"""What lesson 15's checkers share: comparing results, -inf rows included."""

from __future__ import annotations

import torch

from ...course.check import fail

NEG = float("-inf")


def _same(a, b, dtype) -> bool:
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    if a.shape != b.shape:
        return False
    finite = torch.isfinite(b)
    return bool(
        torch.equal(torch.isfinite(a), finite)
        and torch.equal(a[~finite], b[~finite])
        and torch.allclose(a[finite], b[finite], rtol=tol, atol=tol)
    )


def _pair(got, what: str):
    if not (isinstance(got, tuple | list) and len(got) == 2):
        fail(f"{what} must return a pair (o, lse); it returned {type(got).__name__}.")
    return got
