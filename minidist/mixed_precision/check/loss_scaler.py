"""mixed_precision checker: exercise 1: the loss scaler's rule."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ...course.check import best_scale, fail, passed
from ..fixture import grad_scaler_scales
from ._shared import INF, NAN

SCALER_ARGS = dict(init_scale=2.0**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
SCALER_STEPS = 18
# Chosen so that every wrong rule below gives another sequence: a growth right before an
# overflow (5, 6), two overflows in a row (6, 7), a NaN alone (11), and six good steps after
# it (two growths in a row at 14 and 17).
OVERFLOWS = {2: INF, 6: INF, 7: INF, 11: NAN}
LR = 0.01
START = (1.0, -2.0, 3.0, 0.5)
COEF = (0.5, 1.0, -1.0, 2.0)  # the gradient of the loss (p · COEF).sum()


def _drive_scaler(cls: type) -> list[dict]:
    scaler = cls(**SCALER_ARGS)
    p = nn.Parameter(torch.tensor(START, device="cpu"))
    opt = torch.optim.SGD([p], lr=LR)
    out = []
    for step in range(SCALER_STEPS):
        opt.zero_grad()
        scaler.scale((p * torch.tensor(COEF, device="cpu")).sum()).backward()
        if step in OVERFLOWS:
            p.grad[0] = OVERFLOWS[step]
        stepped = scaler.step(opt)
        scaler.update()
        out.append(dict(stepped=stepped, scale=float(scaler.get_scale()), p=p.detach().clone()))
    return out


def _right_params() -> list[torch.Tensor]:
    p, out = torch.tensor(START, device="cpu"), []
    for step in range(SCALER_STEPS):
        if step not in OVERFLOWS:
            p = p - LR * torch.tensor(COEF, device="cpu")
        out.append(p.clone())
    return out


def simulate_scales(rule: str = "right") -> list[float]:
    """The scales after each step under `rule`: "right" (GradScaler's), or a known mistake:
    "every_good_step", "no_reset_on_overflow", "no_reset_after_growth" (the count compared
    with ==, so it never grows again), "no_reset_after_growth_ge" (with >=), "no_backoff"."""
    scale, good = SCALER_ARGS["init_scale"], 0
    interval = SCALER_ARGS["growth_interval"]
    out = []
    for step in range(SCALER_STEPS):
        if step in OVERFLOWS:
            if rule != "no_backoff":
                scale *= SCALER_ARGS["backoff_factor"]
            if rule != "no_reset_on_overflow":
                good = 0
        else:
            good += 1
            if rule == "every_good_step":
                scale *= SCALER_ARGS["growth_factor"]
            elif rule == "no_reset_after_growth_ge" and good >= interval:
                scale *= SCALER_ARGS["growth_factor"]
            elif good == interval:
                scale *= SCALER_ARGS["growth_factor"]
                if rule != "no_reset_after_growth":
                    good = 0
        out.append(scale)
    return out


def _fmt_scales(scales: list[float], upto: int) -> str:
    return (
        "[" + ", ".join(f"2^{math.log2(s):g}" if s > 0 else f"{s:g}" for s in scales[:upto]) + "]"
    )


def _scale_mistake(got: list[float], right: list[float]) -> str:
    first = next(i for i, (a, b) in enumerate(zip(got, right)) if a != b)
    seq = f"your scales after steps 0-{first}: {_fmt_scales(got, first + 1)}, GradScaler's: "
    seq += _fmt_scales(right, first + 1)
    interval = SCALER_ARGS["growth_interval"]
    if got == simulate_scales("every_good_step"):
        return (
            f"the scale doubled after step 0, a single good step ({seq}): it grows only after "
            f"growth_interval = {interval} good steps in a row. Count them in self.good_steps "
            "and double when the count reaches growth_interval."
        )
    if got == simulate_scales("no_reset_on_overflow"):
        return (
            f"the scale grew after step {first}, only {first - 2} good step(s) after the "
            f"overflow at step 2 ({seq}): an overflow restarts the count of good steps in a "
            f"row at 0 (GradScaler resets its growth tracker), so growth waits for "
            f"{interval} good steps after it."
        )
    if got == simulate_scales("no_reset_after_growth"):
        return (
            f"after growing at step 14 the scale never grew again, though steps 15-17 were "
            f"good ({seq}): when the scale grows, reset self.good_steps to 0, so that the next "
            f"growth comes {interval} good steps later."
        )
    if got == simulate_scales("no_reset_after_growth_ge"):
        return (
            f"after growing, the scale grew again after the very next good step ({seq}): "
            "reset self.good_steps to 0 when the scale grows."
        )
    if got == simulate_scales("no_backoff"):
        return (
            f"the overflow at step 2 was skipped but the scale stayed 2^{math.log2(got[2]):g} "
            f"({seq}): multiply it by backoff_factor = 0.5 after an overflow, or the next "
            "step overflows again."
        )
    return (
        f"{seq}. The rule: after an overflow multiply the scale by backoff_factor and set the "
        f"count of good steps to 0; after a good step add 1 to the count, and when it reaches "
        f"growth_interval = {interval} multiply the scale by growth_factor and set it to 0."
    )


def check_loss_scaler(scaler_cls: type) -> None:
    """Train one parameter with SGD and `scaler_cls` for 18 steps, overflows injected."""
    got = _drive_scaler(scaler_cls)
    right = grad_scaler_scales(SCALER_STEPS, tuple(OVERFLOWS), **SCALER_ARGS)
    params = _right_params()
    scales = [g["scale"] for g in got]
    for step, (g, want) in enumerate(zip(got, params)):
        if not isinstance(g["stepped"], bool):
            fail(
                f"step() returned {g['stepped']!r} at step {step}: return True when it stepped "
                "the optimizer and False when it skipped the step."
            )
        overflow = step in OVERFLOWS
        what = "a NaN" if overflow and math.isnan(OVERFLOWS[step]) else "an inf"
        if overflow and g["stepped"]:
            if what == "a NaN" and not any(got[s]["stepped"] for s in OVERFLOWS if s != step):
                fail(
                    f"step {step}'s gradient held a NaN and step() stepped on it: torch.isinf "
                    "finds inf but not NaN (nor does a comparison with float('inf')). Test "
                    "~torch.isfinite(grad): an overflow shows as inf or as NaN (inf - inf)."
                )
            halved = scales[step] == right[step]
            fail(
                f"step {step}'s gradient held {what}: "
                + ("the scale was halved, but " if halved else "")
                + f"the optimizer still stepped, and the parameter now holds {g['p'].tolist()}. "
                "An overflowed step must be skipped: call optimizer.step() only when every "
                "unscaled gradient is finite, and return False."
            )
        if not overflow and not g["stepped"]:
            fail(
                f"step {step} was skipped though every gradient was finite: skip only when a "
                "gradient holds inf or NaN (after dividing it by the scale)."
            )
        if not torch.allclose(g["p"], want, rtol=1e-5, atol=1e-6):
            before = got[step - 1]["p"] if step else torch.tensor(START, device="cpu")
            moved = g["p"] - before
            expected = -LR * torch.tensor(COEF, device="cpu")
            c = best_scale(moved, expected)
            used = scales[step - 1] if step else SCALER_ARGS["init_scale"]
            if abs(c - used) < 1e-3 * used:
                fail(
                    f"at step {step} the parameter moved {c:g}x as far as one SGD step with the "
                    f"true gradient: {c:g} is the loss scale. The gradients still carry the "
                    "scale: divide every gradient by it (unscale) before optimizer.step()."
                )
            if abs(c * used - 1) < 1e-3:
                fail(
                    f"at step {step} the parameter moved 1/{used:g} of one SGD step: the "
                    "gradients were divided by the scale twice. Unscale once."
                )
            fail(
                f"after step {step} the parameter is {g['p'].tolist()}, but one SGD step with "
                f"the unscaled gradient gives {want.tolist()} (moved {c:.3g}x as far)."
            )
    if scales != right:
        fail(_scale_mistake(scales, right))
    passed(
        f"LossScaler follows torch.amp.GradScaler for {SCALER_STEPS} steps (growth every "
        f"{SCALER_ARGS['growth_interval']} good steps, overflows at steps {sorted(OVERFLOWS)}; "
        f"scales after steps 0-7: {_fmt_scales(scales, 8)}), and skipped steps leave the "
        "parameter alone"
    )
