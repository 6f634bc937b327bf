"""What lesson 06 measures: bytes autograd keeps for backward, over a whole step and per
module, and the time of forward and backward.

- `LiveActivations`: like `minidist.memory.SavedActivations`, but it follows the saved
  tensors through backward too: a storage counts from the moment autograd saves it until
  the last node that saved it has run its backward (autograd then frees its saved
  tensors). `live` is the bytes held now, `peak` the most held at once; the recomputation
  inside backward is seen as well, so `peak` is the step's peak of saved activations
  (Chen et al. 2016: the kept segment inputs plus one recomputed segment).
- `saved_by_module`: the bytes one forward saves, attributed to the innermost module
  running when each storage was first saved (operations outside any child, such as the
  loss or a residual add, go to the enclosing module, "" for the root).
- `time_forward_backward`: median forward and backward seconds over repeated steps.

Parameters are model state, not activations: storages of the model's parameters (and of
`exclude`, e.g. FSDP's gathered flat parameters) are left out, as in `SavedActivations`.
Where a GPU exists, `torch.cuda.max_memory_allocated` measures the whole device instead.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable

import torch
import torch.nn as nn


def _storage_ids(model: nn.Module | None, exclude: Iterable[torch.Tensor]) -> set[int]:
    params = list(model.parameters()) if model is not None else []
    return {t.untyped_storage()._cdata for t in [*params, *exclude]}


class _Held:
    """What autograd stores instead of the tensor: when autograd drops it, the count drops."""

    __slots__ = ("owner", "key", "tensor")

    def __init__(self, owner: LiveActivations, key: int, tensor: torch.Tensor):
        self.owner, self.key, self.tensor = owner, key, tensor

    def __del__(self):
        self.owner._release(self.key)


class LiveActivations:
    """Context manager: bytes autograd holds for backward now (`live`) and at most (`peak`).

    Enter it around forward *and* backward. `mark(label)` records (label, live bytes) in
    `marks`, e.g. right after forward. A storage saved by several nodes counts once, until
    the last of them has released it.
    """

    def __init__(self, model: nn.Module | None = None, exclude: Iterable[torch.Tensor] = ()):
        self._excluded = _storage_ids(model, exclude)
        self._held: dict[int, list[int]] = {}  # storage id -> [holders, bytes]
        self.live = 0
        self.peak = 0
        self.marks: list[tuple[str, int]] = []

    def _pack(self, t: torch.Tensor):
        if t.device.type == "meta":
            return t
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self._excluded:
            return t
        entry = self._held.setdefault(key, [0, 0])
        if entry[0] == 0:  # a new storage (an id may be reused once the old one is freed)
            entry[1] = storage.nbytes()
            self.live += entry[1]
            self.peak = max(self.peak, self.live)
        entry[0] += 1
        return _Held(self, key, t)

    @staticmethod
    def _unpack(held):
        return held.tensor if isinstance(held, _Held) else held

    def _release(self, key: int) -> None:
        entry = self._held[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]

    def mark(self, label: str) -> int:
        self.marks.append((label, self.live))
        return self.live

    def __enter__(self) -> LiveActivations:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


def saved_by_module(
    root: nn.Module, run: Callable[[], object], exclude: Iterable[torch.Tensor] = ()
) -> dict[str, int]:
    """Run `run()` (a forward through `root`) and return {module name: bytes saved}.

    Each storage autograd saves is counted once, for the innermost module of `root` that was
    running when it was first saved; names are relative to `root` ("" is `root` itself).
    The values add up to what `SavedActivations(root)` measures around the same forward.
    """
    excluded = _storage_ids(root, exclude)
    stack = [""]
    seen: set[int] = set()
    out: dict[str, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        key = storage._cdata
        if t.device.type != "meta" and key not in excluded and key not in seen:
            seen.add(key)
            out[stack[-1]] = out.get(stack[-1], 0) + storage.nbytes()
        return t

    def enter(name: str) -> None:
        stack.append(name)

    def leave() -> None:  # returns None: a forward hook's return value replaces the output
        stack.pop()

    handles = []
    for name, module in root.named_modules():
        if name:
            handles.append(module.register_forward_pre_hook(lambda m, a, n=name: enter(n)))
            handles.append(module.register_forward_hook(lambda m, a, o: leave()))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            run()
    finally:
        for h in handles:
            h.remove()
    return out


def time_forward_backward(
    forward: Callable[[], torch.Tensor], repeats: int = 10, warmup: int = 2
) -> dict[str, float]:
    """Median seconds of `forward()` (returning a scalar loss) and of its `backward()`."""
    fwd, bwd = [], []
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        loss = forward()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if i >= warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    f, b = statistics.median(fwd), statistics.median(bwd)
    return {"forward": f, "backward": b, "step": f + b}
