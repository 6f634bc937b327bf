"""mixed_precision checker: exercise 1: the loss scaler's rule."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ...course.check import best_scale, fail, passed
from ..fixture import grad_scaler_scales
from ._shared import INF
from .scale_rules import (
    COEF,
    GROUPS,
    LRS,
    NAMES,
    OVERFLOWS,
    SCALER_ARGS,
    SCALER_STEPS,
    START,
    fmt_scales,
    scale_mistake,
    simulate_scales,
)


def _drive_scaler(cls: type) -> list[dict]:
    scaler = cls(**SCALER_ARGS)
    ps = [nn.Parameter(s.clone()) for s in START]
    groups = [dict(params=[ps[i] for i in g], lr=lr) for g, lr in zip(GROUPS, LRS)]
    opt = torch.optim.SGD(groups, lr=LRS[0])
    out = []
    for step in range(SCALER_STEPS):
        opt.zero_grad()
        scaler.scale(sum((p * c).sum() for p, c in zip(ps, COEF))).backward()
        if step in OVERFLOWS:
            which, pos, value = OVERFLOWS[step]
            ps[which].grad.view(-1)[pos] = value
        stepped = scaler.step(opt)
        scaler.update()
        out.append(
            dict(
                stepped=stepped,
                scale=float(scaler.get_scale()),
                p=[p.detach().clone() for p in ps],
                found=getattr(scaler, "found_inf", None),
            )
        )
    return out


def _lr(i: int) -> float:
    return next(lr for g, lr in zip(GROUPS, LRS) if i in g)


def _right_params() -> list[list[torch.Tensor]]:
    ps, out = [s.clone() for s in START], []
    for step in range(SCALER_STEPS):
        if step not in OVERFLOWS:
            ps = [p - _lr(i) * c for i, (p, c) in enumerate(zip(ps, COEF))]
        out.append([p.clone() for p in ps])
    return out


def _where(step: int) -> str:
    which, pos, value = OVERFLOWS[step]
    group = next(g for g, members in enumerate(GROUPS) if which in members)
    what = "a NaN" if math.isnan(value) else ("-inf" if value < 0 else "an inf")
    return f"{what} in parameter {NAMES[which]} (param group {group}, element {pos})"


# wrong loops -> the overflow steps they step on (a set) and what they did
_LOOP_MISTAKES = {
    "overwrite": (
        lambda w, v: w != len(NAMES) - 1,
        "self.found_inf was overwritten by each gradient (found_inf = ...) instead of "
        "combined: only the last parameter's answer survived. Use found_inf |= ... (or any()) "
        "so that one bad gradient anywhere skips the step",
    ),
    "first group": (
        lambda w, v: w not in GROUPS[0],
        "only optimizer.param_groups[0] was looked at: loop over every group in "
        "optimizer.param_groups, and every parameter in each group's 'params'",
    ),
    "first param of each group": (
        lambda w, v: w not in [g[0] for g in GROUPS],
        "only the first parameter of each group (group['params'][0]) was looked at: loop over "
        "every parameter in group['params']",
    ),
    "first param": (
        lambda w, v: w != GROUPS[0][0],
        "only the first parameter of the first group was looked at: loop over every group in "
        "optimizer.param_groups and every parameter in each",
    ),
    "nan": (
        lambda w, v: math.isnan(v),
        "a NaN went unnoticed: torch.isinf finds inf but not NaN (nor does a comparison with "
        "float('inf')). Test ~torch.isfinite(grad): an overflow shows as inf or as NaN (inf - inf)",
    ),
    "-inf": (
        lambda w, v: v == -INF,
        "-inf went unnoticed (a test against float('inf'), torch.isposinf or grad.max()): "
        "an overflow can be -inf too. Test ~torch.isfinite(grad)",
    ),
}


def _skip_mistake(got: list[dict]) -> str | None:
    """Which steps with an overflow were stepped on, named by the wrong loop that predicts them."""
    stepped = {s for s in OVERFLOWS if got[s]["stepped"]}
    if not stepped:
        return None
    listed = "; ".join(f"step {s}: {_where(s)}" for s in sorted(stepped))
    for predict, why in _LOOP_MISTAKES.values():
        if stepped == {s for s, (w, _, v) in OVERFLOWS.items() if predict(w, v)}:
            return f"step() stepped the optimizer although a gradient overflowed ({listed}): {why}."
    s = min(stepped)
    halved = got[s]["scale"] == simulate_scales()[s]
    if stepped == set(OVERFLOWS) and halved:
        return (
            f"at every overflow ({listed}) the scale was halved, but the optimizer still "
            "stepped: an overflowed step must be skipped: call optimizer.step() only when every "
            "unscaled gradient is finite, and return False."
        )
    return (
        f"step() stepped the optimizer although a gradient overflowed ({listed}); it skipped "
        f"the overflows at steps {sorted(set(OVERFLOWS) - stepped)}. Look at every parameter "
        "of every param group, and skip when any element of any gradient is not finite "
        "(~torch.isfinite)."
    )


def _moved(got: list[dict], step: int, i: int) -> float:
    before = got[step - 1]["p"][i] if step else START[i]
    return best_scale(got[step]["p"][i] - before, -_lr(i) * COEF[i])


def check_loss_scaler(scaler_cls: type) -> None:
    """Train three parameters in two param groups with SGD and `scaler_cls` for 18 steps,
    overflows injected in every parameter, at several elements, as inf, -inf and NaN."""
    got = _drive_scaler(scaler_cls)
    right = grad_scaler_scales(SCALER_STEPS, tuple(OVERFLOWS), **SCALER_ARGS)
    params = _right_params()
    scales = [g["scale"] for g in got]
    for step, g in enumerate(got):
        if not isinstance(g["stepped"], bool):
            fail(
                f"step() returned {g['stepped']!r} at step {step}: return True when it stepped "
                "the optimizer and False when it skipped the step."
            )
    s = min(OVERFLOWS)  # the parameters changed though step() said it skipped
    changed = any(not torch.equal(a, b) for a, b in zip(got[s]["p"], got[s - 1]["p"]))
    if changed and got[s]["stepped"] is False:
        first = SCALER_ARGS["init_scale"]
        if abs(_moved(got, 0, 0) - first) < 2e-2 * first:
            fail(
                f"at step 0 the parameters moved {first:g}x as far as one SGD step (the loss "
                f"scale), and at step {s} ({_where(s)}) they changed although step() returned "
                f"{got[s]['stepped']}: optimizer.step() ran before the gradients were unscaled "
                "and checked. Unscale every gradient and test it first; then step only if all "
                "are finite."
            )
        fail(
            f"at step {s} ({_where(s)}) step() returned {got[s]['stepped']}, but the "
            "parameters changed: the optimizer stepped anyway. Return False and call "
            "optimizer.step() only when every unscaled gradient is finite."
        )
    mistake = _skip_mistake(got)
    if mistake:
        fail(mistake)
    for step, g in enumerate(got):
        if step in OVERFLOWS or g["stepped"]:
            continue
        first = min(OVERFLOWS)
        if step > first and not any(got[s]["stepped"] for s in range(first + 1, step + 1)):
            fail(
                f"every step after the overflow at step {first} was skipped though their "
                f"gradients were finite (self.found_inf = {g['found']!r} after step {step}): "
                "set self.found_inf = False at the start of every step(), before the loop."
            )
        fail(
            f"step {step} was skipped though every gradient was finite: skip only when a "
            "gradient holds inf or NaN (after dividing it by the scale)."
        )
    for step, (g, want) in enumerate(zip(got, params)):
        wrong = [i for i in range(len(NAMES)) if not torch.allclose(g["p"][i], want[i], 1e-5, 1e-6)]
        if not wrong:
            continue
        used = scales[step - 1] if step else SCALER_ARGS["init_scale"]
        moved = {i: _moved(got, step, i) for i in wrong}
        names = [NAMES[i] for i in wrong]
        if all(abs(c - used) < 2e-2 * used for c in moved.values()):
            if len(wrong) < len(NAMES):
                fine = [n for n in NAMES if n not in names]
                fail(
                    f"at step {step} parameters {names} moved {used:g}x as far as one SGD step "
                    f"with the true gradient ({used:g} is the loss scale), while {fine} moved "
                    "right: only some gradients were unscaled. Divide the gradient of every "
                    "parameter of every param group by the scale before optimizer.step()."
                )
            fail(
                f"at step {step} the parameters moved {used:g}x as far as one SGD step with the "
                f"true gradient: {used:g} is the loss scale. The gradients still carry the "
                "scale: divide every gradient by it (unscale) before optimizer.step()."
            )
        if all(abs(c * used - 1) < 2e-2 for c in moved.values()):
            fail(
                f"at step {step} parameters {names} moved 1/{used:g} of one SGD step: the "
                "gradients were divided by the scale twice. Unscale once."
            )
        i = wrong[0]
        fail(
            f"after step {step} parameter {NAMES[i]} is {g['p'][i].flatten().tolist()}, but one "
            f"SGD step with the unscaled gradient gives {want[i].flatten().tolist()} (it moved "
            f"{moved[i]:.3g}x as far)."
        )
    if scales != right:
        fail(scale_mistake(scales, right))
    passed(
        f"LossScaler follows torch.amp.GradScaler for {SCALER_STEPS} steps (growth every "
        f"{SCALER_ARGS['growth_interval']} good steps; inf, -inf and NaN at steps "
        f"{sorted(OVERFLOWS)} in each of three parameters of two param groups; scales after "
        f"steps 0-7: {fmt_scales(scales, 8)}), and skipped steps leave every parameter alone"
    )
