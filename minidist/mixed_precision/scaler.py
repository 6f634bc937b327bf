"""Dynamic loss scaling that every rank agrees on: `torch.amp.GradScaler`'s rule, distributed.

Micikevicius et al. 2018, "Mixed Precision Training" (ICLR), section 3.2: fp16 has 5 exponent
bits, so gradients below 2^-24 flush to zero. Multiplying the loss by a scale S moves them up
into range; dividing the gradients by S before the step undoes it. Too large an S overflows:
a gradient becomes inf or NaN, the step is skipped and S halved. After `growth_interval`
good steps in a row S doubles again. The defaults are GradScaler's: S = 2^16, growth 2,
backoff 1/2, interval 2000. Like GradScaler, whose scale is a float32 tensor, a growth that
would reach inf is skipped: the scale stops at the largest finite one it can reach.

Distributed, the ranks must agree: one rank's overflow skips the step on every rank, or the
replicas (or the shards of one model) drift apart. "Found inf" is all-reduced with MAX over
the group before anyone steps: one tiny collective per step.

Skipping cures an overflow, not a NaN that comes from the data or the model: then every step
is skipped and S shrinks towards zero without a word. After `warn_after` skipped steps in a
row, or once S falls below `min_scale`, the scaler warns once (`RuntimeWarning`) naming the
likely causes.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.distributed as dist

from .. import comm

FLOAT32_MAX = torch.finfo(torch.float32).max


class DynamicLossScaler:
    """`scale(loss).backward()`, then `step(optimizer)` (unscale, skip on inf), `update()`."""

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        group=None,
        warn_after: int = 10,
        min_scale: float = 2.0**-14,
    ):
        rules = {
            "init_scale": (init_scale, lambda v: v > 0, "a finite number > 0"),
            "growth_factor": (growth_factor, lambda v: v > 1, "a finite number > 1"),
            "backoff_factor": (backoff_factor, lambda v: 0 < v < 1, "a number in (0, 1)"),
            "min_scale": (min_scale, lambda v: v > 0, "a finite number > 0"),
        }
        for name, (value, ok, rule) in rules.items():
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (number and math.isfinite(value) and ok(value)):
                raise ValueError(f"DynamicLossScaler: {name}={value!r} must be {rule}")
        for name, value in (("growth_interval", growth_interval), ("warn_after", warn_after)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"DynamicLossScaler: {name}={value!r} must be an int >= 1")
        self.scale_value = float(init_scale)
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval, self.group = growth_interval, group
        self.warn_after, self.min_scale = warn_after, min_scale
        self.good_steps = self.skipped_in_a_row = 0
        self._warned = False
        self._found_inf: bool | None = None  # set by unscale_, consumed by update

    def get_scale(self) -> float:
        return self.scale_value

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale_value

    @torch.no_grad()
    def unscale_(self, optimizer) -> bool:
        """Divide every gradient the optimizer steps by the scale; True if any rank overflowed."""
        if self._found_inf is not None:
            raise RuntimeError("unscale_() was already called since the last update()")
        inv = 1.0 / self.scale_value
        grads = list(gradients(optimizer))
        dev = grads[0].device if grads else ("cpu" if not dist.is_initialized() else None)
        dev = dev or comm.group_device(self.group)
        found = torch.zeros((), device=dev)  # the flag lives beside the gradients
        for grad in grads:
            grad.mul_(inv)
            found = torch.maximum(found, (~torch.isfinite(grad)).any().float())
        if dist.is_initialized():
            comm.all_reduce(found, op=comm.ReduceOp.MAX, group=self.group, tag="found-inf")
        self._found_inf = bool(found)
        return self._found_inf

    def step(self, optimizer) -> bool:
        """Unscale (unless done) and step, or skip the step on every rank; True if stepped."""
        if self._found_inf is None:
            self.unscale_(optimizer)
        if self._found_inf:
            return False
        optimizer.step()
        return True

    def update(self) -> None:
        """Halve the scale after an overflow, double it after `growth_interval` good steps
        (unless that leaves float32's range: then it stays)."""
        if self._found_inf is None:
            raise RuntimeError("update() needs a step() (or unscale_()) since the last update()")
        if self._found_inf:
            self.scale_value *= self.backoff_factor
            self.good_steps = 0
            self.skipped_in_a_row += 1
            self._warn_if_stuck()
        else:
            self.good_steps, self.skipped_in_a_row, self._warned = self.good_steps + 1, 0, False
            if self.good_steps == self.growth_interval:
                grown = self.scale_value * self.growth_factor
                if grown <= FLOAT32_MAX:  # GradScaler keeps its scale in float32: never inf
                    self.scale_value = grown
                self.good_steps = 0
        self._found_inf = None

    def _warn_if_stuck(self) -> None:
        if self._warned or (
            self.skipped_in_a_row < self.warn_after and self.scale_value >= self.min_scale
        ):
            return
        self._warned = True
        warnings.warn(
            f"DynamicLossScaler: {self.skipped_in_a_row} steps skipped in a row, the scale is "
            f"down to {self.scale_value:g}: the gradients hold inf or NaN whatever the scale, "
            "which a smaller scale cannot cure. Likely causes: NaN or inf in the input batch "
            "or the labels (check torch.isfinite(batch).all()), a NaN loss (log of 0, "
            "division by 0), or a model whose weights already diverged.",
            RuntimeWarning,
            stacklevel=3,
        )


def gradients(optimizer) -> list[torch.Tensor]:
    """The gradients `optimizer.step()` will use: its parameters' `.grad`, or what the
    optimizer says they are (`optimizer.gradients()`: ZeRO keeps low-precision gradient
    chunks beside its fp32 master chunks and casts them only for the step)."""
    if callable(getattr(optimizer, "gradients", None)):
        return optimizer.gradients()
    return [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
