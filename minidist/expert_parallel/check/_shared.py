"""What lesson 16's checkers share: calling the learner, and inputs that must not change."""

from __future__ import annotations

import re

import torch

from ...course.check import fail
from ...course.failures import Failure, call_learner

# The exercises' own causes, before the generic ones (`minidist.course.failures`); each is
# said only where the failing line shows it (a missing minlength only to a bincount without
# one), so that no answer is told a mistake it does not make.
_IN_PLACE = (
    "an in-place operation on an input (`probs *= ...`, `probs.add_(...)`, `expert[...] = "
    "...`): leave the inputs as they are and compute new tensors"
)
_SIZES = (
    "two tensors of different lengths met: probs is [T, E], expert [T] (experts [T, k]), and "
    "a per-expert count has E entries"
)
_NOT_WHOLE = (
    "C is not a whole number: math.ceil(capacity_factor · T / E) is an int; cf · T / E, or "
    "⌈T / E⌉ · cf, is a float"
)


def hints(failure: Failure, choices: bool = False) -> str | None:
    """The likely cause of a learner's exception in lesson 16's exercises, or None
    (`choices`: the input is experts [T, k], whose dimension 1 is the k choices)."""
    text, line = failure.text, failure.source
    if re.search(r"leaf Variable that requires grad", text):
        return _IN_PLACE
    if re.search(r"slice indices must be integers|must be integers or None", text):
        return _NOT_WHOLE
    if re.search(r"must match the size|size mismatch|shape mismatch", text):
        if "bincount" in line and "minlength" not in line:
            return (
                "torch.bincount(expert) has only max(expert) + 1 entries (an expert may get no "
                "token): torch.bincount(expert, minlength=E)"
            )
        if "one_hot" in line and "num_classes" not in line:
            return (
                "one_hot(expert) has only max(expert) + 1 columns (an expert may get no "
                "token): one_hot(expert, num_classes=E)"
            )
        return _SIZES
    m = re.search(r"index (-?\d+) is out of bounds for dimension (\d+) with size (\d+)", text)
    if m and m.group(2) == "1" and choices:
        return (
            f"column {m.group(1)} of a [T, k] tensor with k = {m.group(3)}: the number of "
            "choices k is experts.shape[1] (1 to 3 in the checks), not a fixed number"
        )
    if re.search(r"^IndexError|out of (range|bounds)", text, re.M):
        return (
            "an index past the end: the tokens are 0 … T − 1, the experts 0 … E − 1 and the "
            "choices 0 … k − 1 (k = experts.shape[1])"
        )
    return None


def call(fn, args: tuple, names: tuple[str, ...], what: str, choices: bool = False):
    """fn(*copies of args), with a time limit; fails if it changed the copies."""
    copies = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)
    given = tuple(
        a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
        for a in args
    )
    out = call_learner(fn, *given, hints=lambda f: hints(f, choices), what=what)
    for name, before, after in zip(names, copies, given, strict=True):
        if isinstance(before, torch.Tensor) and not torch.equal(before, after.detach()):
            fail(
                f"{what}: your code changed its input `{name}` in place (an in-place "
                "operation such as .sort_(), .copy_(), x[...] = ... or x += ...): the router "
                "reuses it after this call, so leave it as it was and work on a copy."
            )
    return out, given
