"""A checker's own diagnosis that can never crash: structure first, then a safe fallback.

A checker names a mistake by predicting the learner's output under a hypothesis and
comparing. Those comparisons assume tensors of the expected shapes and dtypes; a learner's
answer may be anything (a swapped tuple, None, a numpy array, a tensor of another shape).
`tensor_form` says what is wrong with one returned value before any arithmetic touches it,
and `guarded` runs a diagnosis so that an exception inside it (a case the checker did not
foresee) becomes the generic message instead of a traceback from the checker's code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

GUARD_NOTE = (
    " (the checker could not say more precisely what is wrong: compare your answer with "
    "the exercise's text, shapes and dtypes first)"
)


def guarded(diagnose: Callable[..., str | None], fallback: str, *args: Any) -> str | None:
    """`diagnose(*args)`, or `fallback` when the diagnosis itself raises."""
    try:
        return diagnose(*args)
    except Exception:  # the checker's own search failed on an answer it did not foresee
        return fallback + GUARD_NOTE


def tensor_form(
    got: Any, name: str, shape: Sequence[int] | None = None, dtypes: Sequence | None = None
) -> str | None:
    """What is wrong with one returned value that must be a tensor (of `shape`, of one of
    `dtypes`), or None. numpy arrays and Python numbers are named as such."""
    if got is None:
        return f"{name} is None: return a tensor (did a branch end without `return`?)."
    if not isinstance(got, torch.Tensor):
        kind = type(got).__module__.split(".")[0] + "." + type(got).__name__
        if kind.startswith("builtins."):
            kind = type(got).__name__
        hint = " (torch.from_numpy or torch.as_tensor, or stay in torch)" if "numpy" in kind else ""
        return f"{name} is a {kind}, not a torch.Tensor: return a tensor{hint}."
    if shape is not None and tuple(got.shape) != tuple(shape):
        return f"{name} has shape {tuple(got.shape)}, want {tuple(shape)}."
    if dtypes is not None and got.dtype not in tuple(dtypes):
        want = " or ".join(str(d) for d in dtypes)
        return f"{name} has dtype {got.dtype}, want {want}."
    return None
