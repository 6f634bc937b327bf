"""Naive data parallelism: replicate the model, split the batch, all-reduce every gradient.

Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel Training"
(VLDB), section 3.1, describes this as the starting point DDP improves on. After
`loss.backward()` each rank holds the gradient of its own slice of the batch; summing over
ranks and dividing by N gives the gradient of the mean loss over the concatenated batch, so
every replica takes the same optimizer step as one process training on the whole batch.

What it does not do: overlap (communication starts only after backward ends), bucketing
(one all-reduce per parameter, each paying the latency α), unused-parameter handling.
See `bucketed.py` for all three. Native equivalent: `torch.nn.parallel.DistributedDataParallel`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import comm
from ..parallel import ParallelModule, broadcast_parameters, verify_same_model


class NaiveDataParallel(ParallelModule):
    """Wraps a module; call `finish_gradient_sync()` after `backward()`, before `step()`."""

    def __init__(self, module: nn.Module, group=None):
        super().__init__()
        verify_same_model(module, group, "NaiveDataParallel")
        self.module = module
        self.group = group
        self.world_size = dist.get_world_size(group)
        broadcast_parameters(module, group)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def finish_gradient_sync(self) -> None:
        """All-reduce (sum) every gradient, one call per parameter, then divide it by N."""
        for p in self.module.parameters():
            if p.grad is not None:
                comm.all_reduce(p.grad, group=self.group, tag="grad")
                p.grad.div_(self.world_size)
