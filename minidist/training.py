"""Training loops shared by the references, the techniques, the tests and the tour.

Every technique is checked the same way: train the same model on the same data twice,
once in one process without parallelism (`train`) and once on a world (the technique's
own loop, usually `train` with a `forward` and a `before_step` hook), then compare the
losses, gradients and parameters (`max_abs_diff`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn


@dataclass
class TrainTrace:
    losses: list[float]
    grads: dict[str, torch.Tensor]  # after the last backward, before its step
    params: dict[str, torch.Tensor]  # after the last step


def make_optimizer(params, name: str = "sgd", lr: float = 0.05) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    raise ValueError(f"make_optimizer: name must be 'sgd' or 'adam', got {name!r}")


def train(
    model: nn.Module,
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    optimizer: torch.optim.Optimizer | None = None,
    forward: Callable | None = None,
    before_step: Callable[[], None] | None = None,
) -> TrainTrace:
    """One optimizer step per batch; `forward` defaults to `model`, `before_step` to nothing."""
    optimizer = optimizer or make_optimizer(model.parameters())
    forward = forward or model
    losses: list[float] = []
    grads: dict[str, torch.Tensor] = {}
    for x, y in batches:
        optimizer.zero_grad()
        loss = loss_fn(forward(x), y)
        loss.backward()
        if before_step is not None:
            before_step()
        grads = {
            n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None
        }
        optimizer.step()
        losses.append(loss.item())
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return TrainTrace(losses, grads, params)


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest elementwise difference over tensors of the same names (they must match)."""
    if a.keys() != b.keys():
        raise KeyError(f"max_abs_diff: different names: {sorted(a.keys() ^ b.keys())}")
    return max((float((a[k].float() - b[k].float()).abs().max()) for k in a), default=0.0)
