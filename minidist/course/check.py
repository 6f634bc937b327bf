"""What every exercise checker shares: run the learner's code, explain what went wrong.

A checker calls the learner's function (on a world of real processes when it needs one),
compares with the reference, and either prints one line saying what passed or raises
`CheckFailed` whose message names the most likely mistake. Shared here:

- `run_on_world`: a world with a short timeout (a correct answer takes well under a second),
  a learner's `NotImplementedError` on any rank surfaced as itself ("not implemented yet"),
  and a hang turned into a message that says what the lesson's hangs usually mean.
- `diagnose_values`: the usual value mistakes of a reduction, named: nothing reduced, some
  tensors skipped, N times too large (forgot to divide), N times too small (divided twice),
  another uniform scale.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from ..runtime import RankFailedError, WorldTimeoutError, launch, start_method_for

CHECK_TIMEOUT_S = 5.0  # forked ranks; spawned ones first import torch (seconds each)
SPAWN_TIMEOUT_S = 60.0


class CheckFailed(AssertionError):
    """The learner's code ran but gave a wrong answer; the message says what to look at."""


def passed(message: str) -> None:
    print(f"PASSED: {message}")


def fail(message: str) -> None:
    raise CheckFailed(message)


def run_on_world(
    fn: Callable,
    world_size: int,
    *args: Any,
    timeout_s: float | None = None,
    hang_hint: str = "",
) -> list:
    """`launch` for checkers: NotImplementedError surfaced as itself, hangs explained."""
    if timeout_s is None:
        forked = start_method_for(world_size=world_size) == "fork"
        timeout_s = CHECK_TIMEOUT_S if forked else SPAWN_TIMEOUT_S
    try:
        return launch(fn, world_size, *args, timeout_s=timeout_s)
    except RankFailedError as exc:
        if "NotImplementedError" in str(exc):
            raise NotImplementedError(
                f"the exercise is not implemented yet (rank {exc.rank} reached the stub)"
            ) from None
        raise
    except WorldTimeoutError as exc:
        where = "".join(f"\n  rank {r}: {exc.where[r]}" for r in exc.ranks if r in exc.where)
        fail(
            f"on a world of {world_size}, ranks {exc.ranks} were still waiting after "
            f"{timeout_s:g} s (a correct answer takes well under a second): a rank waits "
            f"forever for a message or a collective no other rank sends. {hang_hint}".rstrip()
            + where
        )


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """{name: a copy of the gradient} for every parameter that has one."""
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-6, rtol: float = 1e-5) -> bool:
    """Same shape and equal up to float32 summation order (the default tolerances)."""
    return a.shape == b.shape and torch.allclose(a, b, atol=atol, rtol=rtol)


def best_scale(got: torch.Tensor, ref: torch.Tensor) -> float:
    """The c that best fits got = c·ref (least squares)."""
    return float((got * ref).sum() / (ref * ref).sum().clamp_min(1e-30))


def diagnose_values(
    got: dict[str, torch.Tensor],
    ref: dict[str, torch.Tensor],
    local: dict[str, torch.Tensor],
    world: int,
    layout_problem: str | None = None,
) -> str | None:
    """Name what is wrong with mean-over-ranks tensors `got`, or None when they are right.

    `ref` is the right answer, `local` what this rank held before the reduction.
    `layout_problem` (a lesson's own finding) comes before the generic answer, when the
    error is not a uniform scale.
    """
    missing = sorted(ref.keys() - got.keys())
    if missing:
        return f"parameters {missing} have no gradient after your code ran (grad is None)."
    wrong = [n for n in ref if not close(got[n], ref[n])]
    if not wrong:
        return None
    untouched = [n for n in wrong if close(got[n], local[n])]
    if untouched == wrong and len(wrong) < len(ref):
        return (
            f"parameters {wrong} still hold this rank's own gradient: they were skipped "
            "(loop over every parameter that has a gradient)."
        )
    if untouched == wrong:
        return (
            "every gradient is still this rank's own: nothing was all-reduced "
            "(call comm.all_reduce on each p.grad, in place)."
        )
    scales = [best_scale(got[n], ref[n]) for n in wrong]
    uniform = len(wrong) == len(ref)
    if uniform and all(abs(c - world) < 1e-3 * world for c in scales):
        return (
            f"gradients are {world}x too large: you summed over the {world} ranks but forgot "
            f"to divide by the world size N={world}."
        )
    if uniform and all(abs(c - 1 / world) < 1e-3 for c in scales):
        return (
            f"gradients are {world}x too small: you divided by N={world} twice "
            "(once before and once after the all-reduce, or all-reduced an average)."
        )
    if uniform and len(set(round(c, 4) for c in scales)) == 1:
        return (
            f"gradients are {scales[0]:.4g}x the mean: divide the sum by the world size "
            f"(dist.get_world_size() = {world}), nothing else."
        )
    return layout_problem or (
        f"gradients of {wrong} differ from the mean over ranks; the others are right. "
        "All-reduce (SUM) each gradient in place, then divide it by N."
    )
