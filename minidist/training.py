"""The training loop shared by the references, the techniques, the tests and the tour.

Every technique is checked the same way: train the same model on the same data twice,
once in one process without parallelism and once on a world, both with `train`, then
compare the losses, gradients and parameters (`max_abs_diff`). On a world `train` is given a
`ParallelModule` and reads the state through the comparison contract (`full_grads`,
`full_parameters`: whole tensors under the single-process names, see `minidist.parallel`),
so replicated, sharded, split and staged techniques are compared the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn

from .parallel import ParallelModule, named_grads, named_parameters
from .policy import module_device, to_device


@dataclass
class TrainTrace:
    losses: list[float]
    grads: dict[str, torch.Tensor]  # after the last backward, before its step
    params: dict[str, torch.Tensor]  # after the last step


class OptimizerWrapper:
    """An optimizer that steps an `inner` torch optimizer on other tensors than the model's
    (shards, host copies): what the training loops read of it is the inner one's."""

    inner: torch.optim.Optimizer

    @property
    def param_groups(self) -> list[dict]:
        return self.inner.param_groups

    @property
    def state(self):
        return self.inner.state

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)


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
) -> TrainTrace:
    """One optimizer step per batch; returns the losses, last gradients and final parameters.

    `model` is a plain module (the single-process reference) or a `ParallelModule`, whose
    `finish_gradient_sync()` runs between backward and step and whose full state is read
    through the comparison contract. `forward` replaces `model(x)`, e.g. a torch
    `DistributedDataParallel` around `model`. Each batch moves to the model's device (a GPU
    rank's); the trace's tensors come back on the CPU, where the reference is compared.
    """
    optimizer = optimizer or make_optimizer(model.parameters())
    forward = forward or model
    parallel = isinstance(model, ParallelModule)
    losses: list[float] = []
    grads: dict[str, torch.Tensor] = {}
    device = module_device(model)
    for x, y in batches:
        x, y = to_device(x, device), to_device(y, device)
        optimizer.zero_grad()
        loss = loss_fn(forward(x), y)
        loss.backward()
        if parallel:
            model.finish_gradient_sync()
        grads = model.full_grads() if parallel else named_grads(model)
        optimizer.step()
        losses.append(loss.item())
    params = model.full_parameters() if parallel else named_parameters(model)
    return TrainTrace(losses, _on_cpu(grads), _on_cpu(params))


def _on_cpu(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.cpu() for k, v in tensors.items()}


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest elementwise difference over tensors of the same names (they must match)."""
    if a.keys() != b.keys():
        raise KeyError(f"max_abs_diff: different names: {sorted(a.keys() ^ b.keys())}")
    return max((float((a[k].float() - b[k].float()).abs().max()) for k in a), default=0.0)
