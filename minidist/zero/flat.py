"""One flat, padded, sharded buffer over a list of parameters: the layout ZeRO and FSDP share.

Rajbhandari et al. 2020, "ZeRO", section 5 (partitioning), and PyTorch FSDP's FlatParameter
(Zhao et al. 2023, "PyTorch FSDP", section 3.2.1):

- flatten: the parameters' elements one after another, each at a recorded offset;
- pad: up to a multiple of N with zeros (at most N-1 elements), so that every rank gets an
  equal chunk and a collective never needs uneven sizes;
- shard: rank r owns elements [r·c, (r+1)·c) of the padded buffer, c = padded / N.

With fewer elements than ranks (15 elements on 16 ranks) every rank still owns one element,
and the last ranks own padding only. `views` turns a full flat buffer back into tensors of
the parameters' shapes (sharing its storage). `ShardedBucket` is ZeRO's use of it: a
bucket's parameters moved into one flat buffer, with this rank's chunk as a parameter.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn


class FlatShard:
    """The layout of `params` in a flat buffer padded to a multiple of `world_size`."""

    def __init__(self, params: Sequence[torch.Tensor], world_size: int, rank: int):
        if world_size < 1:
            raise ValueError(f"FlatShard: world_size must be >= 1, got {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"FlatShard: rank must be in [0, {world_size}), got {rank}")
        if not params:
            raise ValueError("FlatShard: params must not be empty")
        self.shapes = [p.shape for p in params]
        self.numels = [p.numel() for p in params]
        self.offsets = [sum(self.numels[:i]) for i in range(len(params))]
        self.numel = sum(self.numels)
        self.chunk = -(-self.numel // world_size)
        self.padded = self.chunk * world_size
        self.world_size, self.rank = world_size, rank
        self.start = rank * self.chunk

    @property
    def padding(self) -> int:
        return self.padded - self.numel

    def flatten(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """A new padded flat buffer holding `tensors` (one per parameter) at their offsets."""
        flat = torch.zeros(self.padded, dtype=tensors[0].dtype, device=tensors[0].device)
        for t, off, n in zip(tensors, self.offsets, self.numels):
            flat[off : off + n].copy_(t.reshape(-1))
        return flat

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Tensors of the parameters' shapes that share `flat`'s storage.

        One `split` rather than a slice per parameter: autograd then joins the views'
        gradients with one concatenation instead of adding a zero-filled buffer the size of
        `flat` per parameter (what PyTorch FSDP's FlatParameter does too).
        """
        pieces = torch.split(flat, [*self.numels, self.padding])
        return [t.view(s) for t, s in zip(pieces, self.shapes)]

    def own(self, flat: torch.Tensor) -> torch.Tensor:
        """This rank's chunk of a padded flat buffer (a view)."""
        return flat[self.start : self.start + self.chunk]

    def valid(self, device=None) -> torch.Tensor:
        """A mask over this rank's chunk, on `device` (the CPU by default): True where a
        parameter element lives, False on padding."""
        index = torch.arange(self.start, self.start + self.chunk, device=device or "cpu")
        return index < self.numel


class ShardedBucket:
    """ZeRO's bucket (`sharded.py`): parameters reduced together, their flat layout, full
    parameters (moved into one flat buffer) and this rank's chunk."""

    def __init__(
        self, names: list[str], params: list[nn.Parameter], world: int, rank: int, dtype=None
    ):
        self.names, self.params = names, params
        self.layout = FlatShard(params, world, rank)
        flat = self.layout.flatten([p.detach() for p in params])
        if dtype is None:  # fp32: the optimizer steps a view of the module's own parameters
            self.flat_param = flat
            self.shard = nn.Parameter(self.layout.own(flat))
        else:  # mixed precision: an fp32 master chunk; the module computes with a copy
            self.shard = nn.Parameter(self.layout.own(flat).clone())
            self.flat_param = flat.to(dtype)
        for p, view in zip(params, self.layout.views(self.flat_param)):
            p.data = view  # the module's parameters now live in the flat buffer
        self.flat_grad: torch.Tensor | None = None
        self.grad_chunk: torch.Tensor | None = None  # this rank's reduced gradient
        self.pending = len(params)
        self.work = None
        self.reduced: torch.Tensor | None = None
