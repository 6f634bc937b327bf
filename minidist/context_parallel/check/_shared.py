"""What lesson 15's checkers share: the form of an (o, lse) answer, comparing results, -inf
rows included."""

from __future__ import annotations

import torch

from ...course.check import fail
from ...course.guard import tensor_form

NEG = float("-inf")


def _same(a, b, dtype) -> bool:
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    if not isinstance(a, torch.Tensor) or a.shape != b.shape:
        return False
    finite = torch.isfinite(b)
    return bool(
        torch.equal(torch.isfinite(a), finite)
        and torch.equal(a[~finite], b[~finite])
        and torch.allclose(a[finite], b[finite], rtol=tol, atol=tol)
    )


def _pair(got, what: str):
    if not (isinstance(got, tuple | list) and len(got) == 2):
        n = f" of {len(got)}" if isinstance(got, tuple | list) else ""
        fail(f"{what} must return a pair (o, lse); it returned a {type(got).__name__}{n}.")
    return got


def form_problem(got, want_o: torch.Tensor, want_l: torch.Tensor, where: str) -> str | None:
    """What is wrong with the FORM of a returned (o, lse) pair (types, order, shapes, dtype),
    before any value is compared, or None."""
    if not (isinstance(got, tuple | list) and len(got) == 2):
        n = f" of {len(got)}" if isinstance(got, tuple | list) else ""
        return f"{where}: return a pair (o, lse); you returned a {type(got).__name__}{n}."
    o, lse = got
    for name, x in (("o", o), ("lse", lse)):
        problem = tensor_form(x, name)
        if problem:
            return f"{where}: {problem}"
    if o.shape == want_l.shape != want_o.shape and lse.shape == want_o.shape:
        return f"{where}: the pair came back as (lse, o): return (o, lse), o first."
    dt = want_o.dtype
    for name, x, want in (("o", o, want_o), ("lse", lse, want_l)):
        if x.shape != want.shape:
            keepdim = " (no keepdim: one value per row)" if name == "lse" else ""
            return f"{where}: {name} has shape {tuple(x.shape)}, want {tuple(want.shape)}{keepdim}."
        if x.dtype != dt:
            return f"{where}: {name} is {x.dtype} for {dt} inputs; keep the inputs' dtype."
    return None
