"""mixed_precision checker: exercise 1's setting, and the scale sequences of the rules a
learner may write instead of GradScaler's (each named by `scale_mistake`)."""

from __future__ import annotations

import math

import torch

from ._shared import INF, NAN

SCALER_ARGS = dict(init_scale=2.0**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
SCALER_STEPS = 18
# Three parameters in two param groups (the loop order: a, b of group 0, then c of group 1);
# step -> (which parameter, which element, the value put there). Chosen so that every wrong
# rule below gives another sequence: a growth right before an overflow (5, 6), two overflows
# in a row (6, 7), a NaN alone (11), six good steps after it (growths at 14 and 17); and
# every wrong loop another set of steps stepped on: the last parameter only (2), a middle one
# (6), the first one (7, 11), a -inf (7) and a NaN (11).
NAMES = ("a", "b", "c")
GROUPS = ((0, 1), (2,))  # indices into NAMES, one tuple per param group
SHAPES = ((4,), (2, 3), (3,))
LRS = (0.01, 0.02)  # per group
OVERFLOWS = {2: (2, 1, INF), 6: (1, 5, INF), 7: (0, 3, -INF), 11: (0, 0, NAN)}
START = tuple(torch.linspace(-1.0, 2.0, math.prod(s), device="cpu").reshape(s) for s in SHAPES)
COEF = tuple(
    torch.linspace(0.5, -1.5, math.prod(s), device="cpu").reshape(s) + i
    for i, s in enumerate(SHAPES)
)
LR = LRS[0]


def simulate_scales(rule: str = "right") -> list[float]:
    """The scales after each step under `rule`: "right" (GradScaler's), or a known mistake:
    "every_good_step", "no_reset_on_overflow", "no_reset_after_growth" (the count compared
    with ==, so it never grows again), "no_reset_after_growth_ge" (with >=), "no_backoff",
    "one_late" (grows after growth_interval + 1 good steps: the count compared before it is
    increased, or with >), "one_early" (after growth_interval - 1)."""
    scale, good = SCALER_ARGS["init_scale"], 0
    interval = SCALER_ARGS["growth_interval"]
    interval += {"one_late": 1, "one_early": -1}.get(rule, 0)
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


def fmt_scales(scales: list[float], upto: int) -> str:
    return (
        "[" + ", ".join(f"2^{math.log2(s):g}" if s > 0 else f"{s:g}" for s in scales[:upto]) + "]"
    )


def scale_mistake(got: list[float], right: list[float]) -> str:
    first = next(i for i, (a, b) in enumerate(zip(got, right)) if a != b)
    seq = f"your scales after steps 0-{first}: {fmt_scales(got, first + 1)}, GradScaler's: "
    seq += fmt_scales(right, first + 1)
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
    if got == simulate_scales("one_late"):
        return (
            f"the scale grows one step late, after {interval + 1} good steps in a row instead "
            f"of growth_interval = {interval} ({seq}): add this step to the count first, then "
            "grow when the count == growth_interval (not >, and not before adding it)."
        )
    if got == simulate_scales("one_early"):
        return (
            f"the scale grows one step early, after {interval - 1} good steps in a row instead "
            f"of growth_interval = {interval} ({seq}): the count starts at 0 and grows by one "
            "per good step; grow when it == growth_interval."
        )
    return (
        f"{seq}. The rule: after an overflow multiply the scale by backoff_factor and set the "
        f"count of good steps to 0; after a good step add 1 to the count, and when it reaches "
        f"growth_interval = {interval} multiply the scale by growth_factor and set it to 0."
    )
