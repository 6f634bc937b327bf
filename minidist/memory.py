"""Seeing the memory: count the bytes a technique keeps alive, on any device.

- `tensor_bytes`: bytes of a set of tensors, each underlying storage counted once (a view,
  a tied weight or a gradient that lives inside a flat bucket is not counted twice).
- `model_state_bytes`: parameters, gradients and optimizer state of one rank, the three
  terms of the memory formulas of Rajbhandari et al. 2020, "ZeRO", section 3.1.
- `SavedActivations`: bytes autograd saves for backward during a forward, measured with
  `torch.autograd.graph.saved_tensors_hooks` (the activations that recomputation, Chen et
  al. 2016 "Training Deep Nets with Sublinear Memory Cost", trades for compute).
- `cuda_peak_bytes`: `torch.cuda.max_memory_allocated` where a GPU exists.

Counting storages instead of reading an allocator makes memory per rank measurable on a
CPU, so the formulas can be checked in CI.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn as nn


def _storage_key(t: torch.Tensor) -> tuple:
    s = t.untyped_storage()
    return (t.device.type, t.device.index, s.data_ptr())


def tensor_bytes(tensors: Iterable[torch.Tensor], exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the storages behind `tensors`, each storage once, minus those in `exclude`."""
    skip = {_storage_key(t) for t in exclude}
    seen: dict[tuple, int] = {}
    for t in tensors:
        if t is None or t.device.type == "meta":
            continue
        key = _storage_key(t)
        if key not in skip:
            seen[key] = t.untyped_storage().nbytes()
    return sum(seen.values())


def optimizer_state_tensors(optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    if optimizer is None:
        return []
    return [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]


@dataclass
class ModelStateBytes:
    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


def model_state_bytes(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    extra_params: Iterable[torch.Tensor] = (),
    extra_grads: Iterable[torch.Tensor] = (),
) -> ModelStateBytes:
    """Parameters, gradients and optimizer state one rank holds.

    `extra_params`/`extra_grads` add buffers a technique owns outside the module (a flat
    parameter shard, a gradient bucket), deduplicated against what is already counted.
    """
    params = list(model.parameters()) + list(extra_params)
    grads = [p.grad for p in model.parameters() if p.grad is not None] + list(extra_grads)
    return ModelStateBytes(
        params=tensor_bytes(params),
        grads=tensor_bytes(grads, exclude=params),
        optimizer=tensor_bytes(optimizer_state_tensors(optimizer), exclude=params + grads),
    )


class SavedActivations:
    """Context manager: bytes autograd saves for backward inside the block.

    Parameters saved by their own layers are excluded (they are model state, not
    activations), and so is anything sharing storage with `exclude` (e.g. FSDP's gathered
    flat parameters, whose views layers save). Storages are told apart by identity, which
    survives a storage being freed and re-allocated in place; each is counted once.
    """

    def __init__(self, model: nn.Module | None = None, exclude: Iterable[torch.Tensor] = ()):
        params = list(model.parameters()) if model is not None else []
        self._excluded = {t.untyped_storage()._cdata for t in [*params, *exclude]}
        self._seen: dict[tuple, int] = {}

    def _pack(self, t: torch.Tensor):
        if t.device.type != "meta" and t.untyped_storage()._cdata not in self._excluded:
            self._seen[_storage_key(t)] = t.untyped_storage().nbytes()
        return t

    def __enter__(self) -> SavedActivations:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)

    @property
    def bytes(self) -> int:
        return sum(self._seen.values())


def cuda_peak_bytes(device: torch.device | int | None = None) -> int | None:
    """Peak bytes allocated on a GPU since the last reset, or None without CUDA."""
    if not torch.cuda.is_available():
        return None
    return torch.cuda.max_memory_allocated(device)
