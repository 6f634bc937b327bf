"""GeePS's parameter cache: only the layers being computed live on the compute device.

Cui et al. 2016, "GeePS: Scalable Deep Learning on Distributed GPUs with a GPU-Specialized
Parameter Server" (EuroSys), sections 3-4: the worker's parameter data sits in a host
staging area (CPU memory); a cache in GPU memory holds only the working set of the layer
being computed plus the next layers, prefetched, and data moves between the two tiers as the
forward pass walks up the layers and the backward pass walks down. So a model bigger than
the GPU's memory still trains, at the price of the bytes moved.

`ParameterCache(layers, prefetch)` does that around a model's layers (modules run in order):

- the **host tier** is the layers' own parameters (pinned when the device is a GPU): what the
  parameter server's pull writes and the optimizer steps;
- the **device tier** is one flat buffer per layer in a pool on `device` whose storage holds
  bytes only while the layer is resident (freed to 0 bytes when evicted);
- before layer l's forward the resident set becomes layers l..l+p (p = `prefetch`), before
  its backward layers l..l-p; layers outside are evicted, layers missing are copied in;
- the forward computes with the device copies (parameters swapped in for the call), the
  tensors autograd saves from them are stored as (layer, view) and read back from the
  device buffer in backward (`saved_tensors_hooks`), and each gradient is moved to the host
  parameter's `.grad` as soon as it is accumulated;
- `with cache.step():` ends by evicting everything (the host values change at the update).

Every move and the resident bytes after it are recorded per (phase, layer) in `events`;
`theory.cache_resident_trace`, `cache_peak_resident_bytes` and `cache_bytes_moved_per_step`
say what they must be. On CPU both tiers are CPU memory (two pools with their own buffers);
with `device="cuda"` the same code uses device memory and pinned host memory (not tested
here: no GPU). Not modelled: GeePS also caches intermediate data (activations) and moves
data in a background thread; here the copies are synchronous and activations stay put.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn as nn

from .theory import cache_window


@dataclass(frozen=True)
class CacheEvent:
    """The resident set changed before `phase` ("forward"/"backward") of `layer`."""

    phase: str
    layer: int
    resident_layers: tuple[int, ...]
    resident_bytes: int  # measured: the device buffers' storage after the change
    moved_in: int  # host -> device bytes of this change


def layer_bytes(layer: nn.Module) -> int:
    """Bytes of a layer's parameter values (what the cache holds for it)."""
    return sum(p.numel() * p.element_size() for p in layer.parameters())


class ParameterCache:
    """Device-tier cache of `layers` (run in this order), holding layers l..l±`prefetch`."""

    def __init__(self, layers, prefetch: int = 1, device: str | torch.device = "cpu"):
        layers = list(layers)
        if not layers or not all(isinstance(m, nn.Module) for m in layers):
            raise ValueError(
                f"ParameterCache: layers must be a non-empty list of modules, got {layers!r}"
            )
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 0:
            raise ValueError(
                f"ParameterCache: prefetch must be an int >= 0 (layers), got {prefetch!r}"
            )
        seen: set[int] = set()
        for i, m in enumerate(layers):
            ids = {id(p) for p in m.parameters()}
            if ids & seen:
                raise ValueError(
                    f"ParameterCache: layer {i} shares a parameter with an earlier layer"
                )
            seen |= ids
        self.layers, self.prefetch, self.device = layers, prefetch, torch.device(device)
        self.names = [[n for n, _ in m.named_parameters(recurse=False)] for m in layers]
        if any(len(list(m.parameters())) != len(n) for m, n in zip(layers, self.names)):
            raise ValueError(
                "ParameterCache: a layer's parameters must be its own (not in submodules)"
            )
        if any(len({p.dtype for p in m.parameters()}) > 1 for m in layers):
            raise ValueError("ParameterCache: a layer's parameters must share one dtype")
        if self.device.type == "cuda":  # the host staging area in pinned memory
            for m in layers:
                for p in m.parameters(recurse=False):
                    p.data = p.data.pin_memory()
        self.buffers, self.views = [], []  # device tier: a flat buffer per layer, its params
        for i, m in enumerate(layers):
            host = [getattr(m, n) for n in self.names[i]]
            dtype = host[0].dtype if host else torch.float32
            flat = torch.empty(sum(p.numel() for p in host), dtype=dtype, device=self.device)
            views, offset = [], 0
            for p in host:
                view = nn.Parameter(flat[offset : offset + p.numel()].view_as(p), p.requires_grad)
                if p.requires_grad:
                    view.register_post_accumulate_grad_hook(self._grad_to_host(p))
                views.append(view)
                offset += p.numel()
            flat.untyped_storage().resize_(0)
            self.buffers.append(flat)
            self.views.append(views)
        self._host = [{n: getattr(m, n) for n in names} for m, names in zip(layers, self.names)]
        self.resident: set[int] = set()
        self.events: list[CacheEvent] = []
        self.moved_out = 0  # device -> host bytes (gradients)
        self._handles = []
        for i, m in enumerate(layers):
            self._handles.append(m.register_forward_pre_hook(self._before_forward(i)))
            self._handles.append(m.register_forward_hook(self._after_forward(i)))
            self._handles.append(m.register_full_backward_pre_hook(self._before_backward(i)))

    # -- the resident set ------------------------------------------------------------------

    def _nbytes(self, i: int) -> int:
        return self.buffers[i].numel() * self.buffers[i].element_size()

    def resident_bytes(self) -> int:
        """Bytes the device tier holds now (measured from the buffers' storage)."""
        return sum(b.untyped_storage().nbytes() for b in self.buffers)

    def _make_resident(self, phase: str, layer: int) -> None:
        want = set(cache_window(layer, len(self.layers), self.prefetch, phase))
        for j in self.resident - want:
            self.buffers[j].untyped_storage().resize_(0)
        moved = 0
        with torch.no_grad():
            for j in sorted(want - self.resident):
                flat = self.buffers[j]
                flat.untyped_storage().resize_(self._nbytes(j))
                host = [getattr(self.layers[j], n) for n in self.names[j]]
                if host:
                    flat.copy_(torch.cat([p.detach().reshape(-1) for p in host]), non_blocking=True)
                moved += self._nbytes(j)
        self.resident = want
        self.events.append(
            CacheEvent(phase, layer, tuple(sorted(want)), self.resident_bytes(), moved)
        )

    def _grad_to_host(self, host: nn.Parameter):
        def hook(view: nn.Parameter) -> None:
            g = view.grad.to(host.device)  # blocking: the optimizer reads it next
            host.grad = g if host.grad is None else host.grad + g
            self.moved_out += g.numel() * g.element_size()
            view.grad = None

        return hook

    # -- hooks -----------------------------------------------------------------------------

    def _before_forward(self, i: int):
        def hook(module, args):
            self._make_resident("forward", i)
            for n, view in zip(self.names[i], self.views[i]):
                module._parameters[n] = view  # compute with the device copy

        return hook

    def _after_forward(self, i: int):
        def hook(module, args, output):
            for n in self.names[i]:
                module._parameters[n] = self._host[i][n]

        return hook

    def _before_backward(self, i: int):
        def hook(module, grad_output):
            self._make_resident("backward", i)

        return hook

    def _pack(self, t: torch.Tensor):
        if t.device == self.device and t.untyped_storage().nbytes():
            ptr = t.untyped_storage().data_ptr()
            for j in self.resident:
                if self.buffers[j].untyped_storage().data_ptr() == ptr:
                    return (j, t.size(), t.stride(), t.storage_offset(), t.requires_grad)
        return t

    def _unpack(self, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        j, size, stride, offset, _ = packed
        if j not in self.resident:
            raise RuntimeError(
                f"ParameterCache: layer {j} was evicted before its backward needed it"
            )
        return self.buffers[j].as_strided(size, stride, offset)

    @contextmanager
    def step(self):
        """One forward and backward through the cache; everything evicted at the end."""
        try:
            with (
                warnings.catch_warnings(),
                torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack),
            ):  # the first layer's input needs no gradient: its backward hook still fires
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                yield self
        finally:
            for j in self.resident:
                self.buffers[j].untyped_storage().resize_(0)
            self.resident = set()

    def remove(self) -> None:
        """Take the hooks off the layers (the model is as before)."""
        for h in self._handles:
            h.remove()
