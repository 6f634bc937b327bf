"""Seeing the memory: count the bytes a technique keeps alive, on any device.

- `tensor_bytes`: bytes of a set of tensors, each underlying storage counted once (a view,
  a tied weight or a gradient that lives inside a flat bucket is not counted twice).
- `state_bytes(model, optimizer=None)`: the one call for any model, plain or wrapped (DDP,
  ZeRO, FSDP, offload): bytes by kind (parameters, gradients, optimizer state, buffers) of
  what this rank holds. A wrapper says what it holds beyond its module through
  `memory_tensors()` (`minidist.parallel.ParallelModule`: shards, flat buckets, gathered
  flat parameters, its own optimizer).
- `model_state_bytes`: parameters, gradients and optimizer state of one rank, the three
  terms of the memory formulas of Rajbhandari et al. 2020, "ZeRO", section 3.1.
- `SavedActivations`: bytes autograd saves for backward during a forward, measured with
  `torch.autograd.graph.saved_tensors_hooks` (the activations that recomputation, Chen et
  al. 2016 "Training Deep Nets with Sublinear Memory Cost", trades for compute); a
  wrapper's parameters, FSDP's gathered flat parameters included, are not activations;
  `kept_for_backward` adds what a backward needs that autograd does not save (a
  non-reentrant checkpoint's inputs, held by its closure).
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


@dataclass
class StateBytes:
    """What one rank holds, by kind, each storage counted once (a kind does not count a
    storage an earlier kind already did: a gradient living in a parameter's bucket)."""

    params: int
    grads: int
    optimizer: int
    buffers: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.buffers

    def model_state(self) -> ModelStateBytes:
        """The three terms of ZeRO's formulas (buffers left out)."""
        return ModelStateBytes(self.params, self.grads, self.optimizer)


def held_tensors(model: nn.Module) -> dict:
    """{"params", "grads", "buffers": tensors, "optimizer": an optimizer or None} that
    `model` holds: a wrapper's `memory_tensors()`, or a plain module's own."""
    if hasattr(model, "memory_tensors"):
        return model.memory_tensors()
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    return {"params": params, "grads": grads, "buffers": list(model.buffers()), "optimizer": None}


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> StateBytes:
    """Bytes this rank holds for `model` (plain, or any minidist wrapper) by kind.

    `optimizer`: the one stepping it (default: the wrapper's own, as `ZeroDataParallel`'s);
    its state tensors count as optimizer state, wherever they live (an `OffloadOptimizer`'s
    on the host: pass None there to count the device only).
    """
    held = held_tensors(model)
    params, grads = list(held["params"]), list(held["grads"])
    opt = optimizer if optimizer is not None else held.get("optimizer")
    return StateBytes(
        params=tensor_bytes(params),
        grads=tensor_bytes(grads, exclude=params),
        optimizer=tensor_bytes(optimizer_state_tensors(opt), exclude=params + grads),
        buffers=tensor_bytes(held["buffers"], exclude=params + grads),
    )


class SavedActivations:
    """Context manager: bytes autograd saves for backward inside the block.

    Parameters saved by their own layers are excluded (they are model state, not
    activations): every parameter `model` holds (`held_tensors`), FSDP's gathered flat
    parameters, whose views layers save, included; and so is anything sharing storage with
    `exclude`. Storages are told apart by identity, which survives a storage being freed
    and re-allocated in place; each is counted once.
    """

    def __init__(self, model: nn.Module | None = None, exclude: Iterable[torch.Tensor] = ()):
        params = list(held_tensors(model)["params"]) if model is not None else []
        self._excluded = {t.untyped_storage()._cdata for t in [*params, *exclude]}
        self._seen: dict[tuple, int] = {}

    def _pack(self, t: torch.Tensor):
        if t.device.type != "meta" and t.untyped_storage()._cdata not in self._excluded:
            self._seen[_storage_key(t)] = t.untyped_storage().nbytes()
        return t

    def __enter__(self) -> SavedActivations:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        _open.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _open.remove(self)
        self._hooks.__exit__(*exc)

    @property
    def bytes(self) -> int:
        return sum(self._seen.values())


_open: list[SavedActivations] = []  # the measurements running now, innermost last


def kept_for_backward(tensors: Iterable[torch.Tensor]) -> None:
    """Count `tensors` in every `SavedActivations` open now: what a backward needs that
    autograd does not save (a non-reentrant checkpoint holds its segment's inputs in the
    closure that recomputes it, under hooks of its own that hide them from the outer ones)."""
    for measuring in _open:
        for t in tensors:
            measuring._pack(t)


def cuda_peak_bytes(device: torch.device | int | None = None) -> int | None:
    """Peak bytes allocated on a GPU since the last reset, or None without CUDA."""
    if not torch.cuda.is_available():
        return None
    return torch.cuda.max_memory_allocated(device)
