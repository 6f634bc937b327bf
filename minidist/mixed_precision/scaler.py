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
"""

from __future__ import annotations

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
    ):
        if init_scale <= 0 or growth_factor <= 1 or not 0 < backoff_factor < 1:
            raise ValueError(
                "DynamicLossScaler: need init_scale > 0, growth_factor > 1 and "
                f"0 < backoff_factor < 1; got {init_scale}, {growth_factor}, {backoff_factor}"
            )
        if growth_interval < 1:
            raise ValueError(f"growth_interval must be >= 1, got {growth_interval}")
        self.scale_value = float(init_scale)
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval, self.group = growth_interval, group
        self.good_steps = 0
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
        found = torch.zeros(())
        for grad in gradients(optimizer):
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
        else:
            self.good_steps += 1
            if self.good_steps == self.growth_interval:
                grown = self.scale_value * self.growth_factor
                if grown <= FLOAT32_MAX:  # GradScaler keeps its scale in float32: never inf
                    self.scale_value = grown
                self.good_steps = 0
        self._found_inf = None


def gradients(optimizer) -> list[torch.Tensor]:
    """The gradients `optimizer.step()` will use: its parameters' `.grad`, or what the
    optimizer says they are (`optimizer.gradients()`: ZeRO keeps low-precision gradient
    chunks beside its fp32 master chunks and casts them only for the step)."""
    if callable(getattr(optimizer, "gradients", None)):
        return optimizer.gradients()
    return [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
