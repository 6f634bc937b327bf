"""Naive data parallelism: replicate the model, split the batch, all-reduce every gradient.

SYLLABUS section 1; Li et al. 2020 "PyTorch Distributed" section 3 describes this as the
starting point DDP improves on. After `loss.backward()` each rank holds the gradient of its
own slice of the batch; summing over ranks and dividing by N gives the gradient of the mean
loss over the concatenated batch, so every replica takes the same optimizer step as one
process training on the whole batch.

What it does not do: overlap (communication starts only after backward ends), bucketing
(one all-reduce per parameter, each paying the latency α), unused-parameter handling.
See `bucketed.py` for all three. Native equivalent: `torch.nn.parallel.DistributedDataParallel`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import comm


def first_rank(group) -> int:
    """Global rank of the group's rank 0, the source of the initial broadcast."""
    return dist.get_global_rank(group, 0) if group is not None else 0


def broadcast_parameters(module: nn.Module, src: int = 0, group=None) -> None:
    """Make every replica start from rank `src`'s parameters and buffers."""
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            comm.broadcast(t.data, src=src, group=group, tag="init")


class NaiveDataParallel(nn.Module):
    """Wraps a module; call `all_reduce_gradients()` after `backward()`, before `step()`."""

    def __init__(self, module: nn.Module, group=None):
        super().__init__()
        self.module = module
        self.group = group
        self.world_size = dist.get_world_size(group)
        broadcast_parameters(
            module, src=dist.get_global_rank(group, 0) if group else 0, group=group
        )

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def all_reduce_gradients(self) -> None:
        for p in self.module.parameters():
            if p.grad is not None:
                comm.all_reduce(p.grad, group=self.group, tag="grad")
                p.grad.div_(self.world_size)
