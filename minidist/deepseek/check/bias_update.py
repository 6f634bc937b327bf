"""Exercise: DeepSeek-V3's auxiliary-loss-free bias update (§2.1.2): after each step,
b_i ← b_i − γ·sign(load_i − mean load), on the global load the caller gives."""

from __future__ import annotations

import torch

from ...course.check import call_learner, fail, passed
from ..moe import bias_step


def _cases() -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    """(bias, load, speed): 3, 5 and 8 experts, loads with experts exactly at the mean and all
    equal, biases float32 and float64 (not zero: an update that drops them shows)."""
    g = torch.Generator().manual_seed(19)
    loads = [
        [7, 1, 4],  # mean 4: one over, one under, one at the mean
        [10, 0, 5, 5, 5],
        [30, 2, 9, 9, 17, 3, 0, 2],
        [6, 6, 6, 6, 6],  # balanced: nothing moves
        [0, 0, 3],  # mean 1: the mean is not a whole number of tokens
        [12, 13, 11, 12, 12, 12, 12, 12],
        [1, 2],
    ]
    out = []
    for n, row in enumerate(loads):
        dtype = torch.float32 if n % 2 else torch.float64
        bias = torch.randn(len(row), generator=g, dtype=torch.float64, device="cpu") * 0.1
        out.append((bias.to(dtype), torch.tensor(row, device="cpu"), (0.001, 0.25, 1.0)[n % 3]))
    return out


def _delta(bias, load, speed):
    return bias_step(torch.zeros_like(bias), load, speed)


# What a wrong answer returns on (bias, load, speed); the first that matches every case names it.
MISTAKES = {
    "the sign is flipped: an OVERLOADED expert (load > mean) must become less attractive, so its "
    "bias goes DOWN (b − γ·sign(load − mean)), an underloaded one's up": lambda b, n, s: (
        b - _delta(b, n, s)
    ),
    "the move is proportional to load − mean: DeepSeek-V3 moves every bias by the same step γ, "
    "in the direction of −sign(load − mean) (torch.sign), whatever the size of the imbalance": (
        lambda b, n, s: b - s * (n.double() - n.double().mean()).to(b.dtype)
    ),
    "an expert exactly at the mean moved: sign(0) = 0, so a balanced expert's bias stays (a "
    "comparison such as load > mean, else +γ, moves it)": lambda b, n, s: (
        b - s * torch.where(n.double() > n.double().mean(), 1.0, -1.0).to(b.dtype)
    ),
    "the mean load was computed with integer division (load.sum() // E on int64 counts), which "
    "rounds it down: use load.float().mean() (or .double())": lambda b, n, s: (
        b - s * torch.sign(n - n.sum() // n.numel()).to(b.dtype)
    ),
    "the speed γ is missing: b − γ·sign(load − mean)": lambda b, n, s: b + _delta(b, n, s) / s,
    "you returned the change −γ·sign(load − mean) alone: return the NEW bias, the old bias plus "
    "that change (it accumulates over steps)": lambda b, n, s: _delta(b, n, s),
    "the load was compared with its sum (or its maximum) instead of its MEAN over the experts": (
        lambda b, n, s: b - s * torch.sign(n - n.sum()).to(b.dtype)
    ),
}


def _hints(failure) -> str | None:
    if "could not infer output dtype" in failure.text:
        return "load is int64 counts and .mean() needs a float: load.float().mean() (or .double())"
    return None


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    # float64: exact but for the rounding of b − γ (1e-15); float32: its own rounding (1e-7)
    atol = 1e-12 if want.dtype == torch.float64 else 1e-6
    return got.shape == want.shape and bool(torch.allclose(got.double(), want.double(), 0, atol))


def check_bias_update(update) -> None:
    """`update(bias, load, speed)` returns the new bias (a new tensor of bias's dtype): bias
    [E] the routing biases, load [E] int64 the tokens each expert got this step over every
    rank, speed the bias update speed γ."""
    cases = _cases()
    got = []
    for bias, load, speed in cases:
        what = f"update(bias [{bias.numel()}] {bias.dtype}, load {load.tolist()}, speed={speed})"
        b, n = bias.clone(), load.clone()
        out = call_learner(update, b, n, speed, hints=_hints, what=what)
        if not torch.equal(n, load):
            fail(f"{what} changed `load` in place: leave the measured load as it was.")
        if not torch.equal(b, bias):
            fail(
                f"{what} updated `bias` in place (bias -= ..., bias.sub_(...)): the router's "
                "buffer is the caller's to write; return a NEW tensor."
            )
        if not isinstance(out, torch.Tensor) or out.shape != bias.shape:
            form = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            fail(
                f"{what} returned {form}: return the new bias, a tensor of shape "
                f"{tuple(bias.shape)}."
            )
        if out.dtype != bias.dtype:
            fail(
                f"{what} returned {out.dtype}: keep bias's dtype ({bias.dtype}); sign of the "
                "float64 load must be cast back, .to(bias.dtype)."
            )
        got.append(out)
    wrong = [i for i, (c, g) in enumerate(zip(cases, got)) if not _close(g, bias_step(*c))]
    if not wrong:
        passed(
            f"b − γ·sign(load − mean) on {len(cases)} loads of 2 to 8 experts (experts at "
            "the mean, all balanced), float32 and float64"
        )
        return
    for name, alt in MISTAKES.items():
        if all(_close(g, alt(*c)) for c, g in zip(cases, got)):
            fail(f"update: {name}.")
    bias, load, speed = cases[wrong[0]]
    want = bias_step(bias, load, speed)
    i = int((got[wrong[0]].double() - want.double()).abs().argmax())
    mean = load.double().mean().item()
    fail(
        f"update on load {load.tolist()} (mean {mean:.4g}), speed {speed}: expert {i} (load "
        f"{int(load[i])}) moved by {float(got[wrong[0]][i] - bias[i]):.6g}, want "
        f"{float(want[i] - bias[i]):.6g} (−γ·sign(load − mean))."
    )
