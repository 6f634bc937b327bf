"""What every exercise checker shares: run the learner's code, explain what went wrong.

A checker calls the learner's function (on a world of real processes when it needs one),
compares with the reference, and either prints one line saying what passed or raises
`CheckFailed` whose message names the most likely mistake. Shared here:

- `run_on_world`: a world with short limits on CPU time (a correct answer takes well under a
  second), which a loaded machine does not stretch,
  a learner's `NotImplementedError` on any rank surfaced as itself ("not implemented yet"),
  any other exception, a rank failing inside a collective, and a hang turned into a
  message (`failures`: what was raised, where in the learner's code, the likely cause from
  the checker's `hints`), never a raw traceback.
- `call_learner`: the same for the learner's code called in this process, with a time
  limit, so that a loop that never ends is reported as one; `bounded` puts a time limit on
  a checker's own diagnosis, so that a check answers in seconds whatever the answer.
- `Mistake`, `catalogue_messages`, `names_mistake` (`catalogue`): a checker's tests of many
  wrong answers that share their world launches.
- `diagnose_values`: the usual value mistakes of a reduction, named: nothing reduced, some
  tensors skipped, N times too large (forgot to divide), N times too small (divided twice),
  another uniform scale.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from ..runtime import RankFailedError, WorldTimeoutError, start_method_for
from .catalogue import Mistake, catalogue_messages, launch_shared, message_of, names_mistake
from .failures import (
    COLLECTIVE_HINT,
    CheckFailed,
    Failure,
    Hints,
    LearnerFailed,
    bounded,
    call_learner,
    explain_rank_failure,
    parse_traceback,
    time_limit,
)

__all__ = [
    "COLLECTIVE_HINT",
    "CheckFailed",
    "Failure",
    "Hints",
    "LearnerFailed",
    "Mistake",
    "bounded",
    "call_learner",
    "catalogue_messages",
    "message_of",
    "names_mistake",
    "parse_traceback",
    "time_limit",
    "run_on_world",
    "passed",
    "fail",
    "grads",
    "close",
    "best_scale",
    "where_differs",
    "diagnose_values",
]

# A checker's world is stopped by CPU time, not the clock, so that a right answer on a
# machine at load 20 is not taken for a hang: a rank's CPU time past CHECK_TIMEOUT_S (a loop
# that never ends), or CHECK_IDLE_S in which no running rank uses the CPU (every one waits:
# a hang); the clock only behind them (WALL_FACTOR times the CPU limit, at least CHECK_WALL_S).
CHECK_TIMEOUT_S = 5.0  # forked ranks; spawned ones first import torch (seconds each)
SPAWN_TIMEOUT_S = 60.0
CHECK_IDLE_S = 3.0
CHECK_WALL_S = 120.0
WALL_FACTOR = 10


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
    hints: Hints = None,
) -> list:
    """`launch` for checkers: NotImplementedError surfaced as itself; an exception, a rank
    failing in a collective or a hang raised as `LearnerFailed` whose message explains it.

    `hints` (a {regex: likely cause} mapping or a function of a `Failure`) names what an
    exception most likely means in this exercise. `LearnerFailed` is a `RankFailedError`
    too, and quotes the exception's last line, so a checker may still catch and refine it.
    """
    if timeout_s is None:
        forked = start_method_for(world_size=world_size) == "fork"
        timeout_s = CHECK_TIMEOUT_S if forked else SPAWN_TIMEOUT_S
    limits = {
        "cpu_s": timeout_s,
        "idle_s": CHECK_IDLE_S,
        "timeout_s": max(CHECK_WALL_S, WALL_FACTOR * timeout_s),
    }
    try:
        return launch_shared(fn, world_size, args, limits)
    except RankFailedError as exc:
        kind = parse_traceback(str(exc).split("\n", 1)[-1]).kind
        if kind == "NotImplementedError" or "exercise: replace this line" in str(exc):
            raise NotImplementedError(
                f"the exercise is not implemented yet (rank {exc.rank} reached the stub)"
            ) from None
        raise explain_rank_failure(exc, world_size, hints, hang_hint) from None
    except WorldTimeoutError as exc:
        raise LearnerFailed(None, _hang_message(exc, world_size, hang_hint)) from None


def _hang_message(exc: WorldTimeoutError, world_size: int, hang_hint: str) -> str:
    """What a stopped world says to the learner: by the limit it broke."""
    where = "".join(f"\n  rank {r}: {exc.where[r]}" for r in exc.ranks if r in exc.where)
    waits = (
        "a rank waits forever for a message or a collective no other rank makes "
        f"({COLLECTIVE_HINT})"
    )
    if exc.why == "idle":
        what = (
            f"ranks {exc.ranks} were still waiting after {exc.limit_s:g} s in which none of "
            f"them used the CPU (a correct answer takes well under a second): {waits}."
        )
    elif exc.why == "cpu":
        what = (
            f"rank {exc.spinning} was still running after {exc.limit_s:g} s of CPU time (a "
            f"correct answer takes well under a second): a loop that never ends, or one far "
            f"too long, on that rank (ranks {exc.ranks} had not finished)."
        )
    else:
        what = (
            f"ranks {exc.ranks} were still waiting after {exc.limit_s:g} s (a correct answer "
            f"takes well under a second): either {waits}, or a loop never ends."
        )
    return f"on a world of {world_size}, {what} {hang_hint}".rstrip() + where


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """{name: a copy of the gradient} for every parameter that has one."""
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-6, rtol: float = 1e-5) -> bool:
    """Same shape and equal up to float32 summation order (the default tolerances)."""
    return a.shape == b.shape and torch.allclose(a, b, atol=atol, rtol=rtol)


def where_differs(got: torch.Tensor, want: torch.Tensor, atol: float = 1e-6) -> str:
    """The fallback's words: how many elements differ, the first one (flat index, got vs
    expected) and the largest difference."""
    g, w = got.detach().reshape(-1).float(), want.detach().reshape(-1).float()
    if g.numel() != w.numel():
        return f"{g.numel()} elements where {w.numel()} are expected"
    bad = ((g - w).abs() > atol + 1e-5 * w.abs()).nonzero().reshape(-1)
    if bad.numel() == 0:
        return "no element differs"
    i = int(bad[0])
    return (
        f"{bad.numel()} of {g.numel()} elements differ, the first at flat index {i} (got "
        f"{g[i].item():.6g}, expected {w[i].item():.6g}), by up to "
        f"{float((g - w).abs().max()):.3g}"
    )


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
    if all(close(got[n], local[n] / world) for n in wrong):
        return (
            f"gradients {wrong} are this rank's own divided by N={world}: the all-reduce ran on "
            "a copy (p.grad.clone(), p.grad / N, a new tensor) and its result was dropped. "
            "All-reduce p.grad itself, in place, then divide it."
        )
    scales = [best_scale(got[n], ref[n]) for n in wrong]
    uniform = len(wrong) == len(ref)
    if uniform and all(abs(c - world) < 1e-3 * world for c in scales):
        return (
            f"gradients are {world}x too large: you summed over the {world} ranks but forgot "
            f"to divide by the world size N={world}."
        )
    if uniform and world > 2 and all(abs(c - world / (world - 1)) < 1e-3 for c in scales):
        return (
            f"gradients are {world}/{world - 1} of the mean: you divided the sum over {world} "
            f"ranks by N-1 = {world - 1}; divide by the world size N = {world}."
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
        f"gradients of {wrong} differ from the mean over ranks, not by a uniform factor "
        f"(in {wrong[0]}: {where_differs(got[wrong[0]], ref[wrong[0]])}); the others are "
        "right. All-reduce (SUM) each gradient in place, then divide it by N."
    )
