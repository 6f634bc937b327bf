"""ZeRO stage 1 as an optimizer wrapper: `torch.distributed.optim.ZeroRedundancyOptimizer`'s
place in a training loop, with ZeRO's flat partition (Rajbhandari et al. 2020, section 5.1).

Wrap any torch optimizer class around the parameters of one data-parallel replica. At
`step()` the gradients of all of them, flattened and padded (`FlatShard`), are
reduce-scattered over the data-parallel group (the mean lands on the rank that owns each
chunk), the inner optimizer steps this rank's chunk of an fp32 flat copy of the parameters
(its state is 1/N of the model's), and the updated chunks are all-gathered back into every
parameter. Use it where the gradient reduction must happen once per step in a loop of its
own (pipeline micro-batches, 3D parallelism), instead of `ZeroDataParallel`'s hooks.

`offload()` moves the chunk and the inner optimizer's state to host memory (lesson 05,
ZeRO-Offload's placement for the sharded states; Megatron-core's `optimizer_cpu_offload`):
each reduced gradient chunk is copied down, the step runs on the host, the updated chunk
is copied up for the all-gather; `moved` counts the bytes of each copy.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import comm
from ..training import OptimizerWrapper
from .flat import FlatShard


class ZeroRedundancyOptimizer(OptimizerWrapper):
    """`optimizer_class` on this rank's 1/N of `params`; `step()` also reduces the gradients."""

    def __init__(self, params, optimizer_class=torch.optim.Adam, group=None, **defaults):
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("ZeroRedundancyOptimizer: no trainable parameters")
        self.group, self.world = group, dist.get_world_size(group)
        self.layout = FlatShard(self.params, self.world, dist.get_rank(group))
        flat = self.layout.flatten([p.detach().float() for p in self.params])
        self.shard = nn.Parameter(self.layout.own(flat).clone())
        self.inner = optimizer_class([self.shard], **defaults)
        self.device = self.shard.device  # where the collectives run (the chunk may not)
        self.offloaded = False
        self.moved = {"device_to_host": 0, "host_to_device": 0}

    def offload(self) -> None:
        """The chunk (and a new inner optimizer's state) in host memory, pinned on a GPU
        machine so that the copies are DMA transfers; call before the first step."""
        pinned = self.device.type == "cuda"
        host = torch.empty(self.shard.shape, device="cpu", pin_memory=pinned)
        self.shard = nn.Parameter(host.copy_(self.shard.detach()))
        self.inner = type(self.inner)([self.shard], **self.inner.defaults)
        self.offloaded = True

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        """`t` (on the device) where the chunk lives: a counted copy when offloaded."""
        if not self.offloaded:
            return t
        self.moved["device_to_host"] += t.numel() * t.element_size()
        return t.to("cpu", copy=True)

    def to_device(self, t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """`t` (the chunk) on the device, in `dtype`: the collectives' send buffer (a counted
        copy when offloaded; else `t` itself when it is already there, nothing copied)."""
        out = t.to(self.device, dtype or t.dtype, copy=self.offloaded)
        if self.offloaded:
            self.moved["host_to_device"] += out.numel() * out.element_size()
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.reduce_gradients()
        self.update()

    @torch.no_grad()
    def reduce_gradients(self) -> None:
        """The gradients' mean over the group, this rank's chunk of it in `shard.grad`
        (the first half of `step`; composed layouts reduce other groups first)."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat_grad = self.layout.flatten([g.float() for g in grads]).div_(self.world)
        chunk = flat_grad.new_empty(self.layout.chunk)
        comm.reduce_scatter(chunk, flat_grad, group=self.group, tag="zero1-grads")
        self.shard.grad = self.to_host(chunk)

    @torch.no_grad()
    def update(self) -> None:
        """The inner step on this rank's chunk, then every chunk gathered into the params."""
        self.inner.step()
        self.gather()

    @torch.no_grad()
    def gather(self) -> None:
        """Every rank's chunk of the (float32) flat copy, written into the parameters."""
        full = self.shard.new_empty(self.layout.padded, device=self.device)
        comm.all_gather(
            full, self.to_device(self.shard.detach()), group=self.group, tag="zero1-params"
        )
        for p, view in zip(self.params, self.layout.views(full)):
            p.copy_(view)
