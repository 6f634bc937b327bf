"""What lesson 16's checkers share: calling the learner, and inputs that must not change."""

from __future__ import annotations

import torch

from ...course.check import fail
from ...course.failures import call_learner

# The exercises' own causes, before the generic ones (`minidist.course.failures`).
HINTS = {
    r"leaf Variable that requires grad": "an in-place operation on an input (`probs *= ...`, "
    "`probs.add_(...)`, `expert[...] = ...`): leave the inputs as they are and compute new "
    "tensors",
    r"must match the size|size mismatch": "two tensors of different lengths met: "
    "torch.bincount(expert) and one_hot(expert) have only max(expert) + 1 entries unless "
    "told minlength=E / num_classes=E (an expert may get no token), and probs is [T, E]",
    r"slice indices must be integers": "C is not a whole number: math.ceil(capacity_factor · "
    "T / E) is an int; cf · T / E, or ⌈T / E⌉ · cf, is a float",
    r"^IndexError|out of (range|bounds)": "an index past the end: the tokens are 0 … T − 1 "
    "and the experts 0 … E − 1",
}


def call(fn, args: tuple, names: tuple[str, ...], what: str):
    """fn(*copies of args), with a time limit; fails if it changed the copies."""
    copies = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)
    given = tuple(
        a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
        for a in args
    )
    out = call_learner(fn, *given, hints=HINTS, what=what)
    for name, before, after in zip(names, copies, given, strict=True):
        if isinstance(before, torch.Tensor) and not torch.equal(before, after.detach()):
            fail(
                f"{what}: your code changed its input `{name}` in place (an in-place "
                "operation such as .sort_(), .copy_(), x[...] = ... or x += ...): the router "
                "reuses it after this call, so leave it as it was and work on a copy."
            )
    return out, given
