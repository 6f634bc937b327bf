"""One FSDP unit: a module's parameters as one flat parameter, sharded, gathered on demand.

Zhao et al. 2023, "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel"
(VLDB), section 3.2 (FlatParameter: flatten, pad, shard), 3.3 (unshard before a unit runs,
reshard after), and FairScale's FSDP, which it grew from.

- The unit's trainable parameters are removed from their modules. Their values live in one
  flat buffer `full` (a leaf that requires grad), padded to a multiple of the shard group's
  size; this rank keeps only its chunk, `shard` (its own storage: what the optimizer steps).
- `unshard()` re-allocates `full`'s storage and all-gathers every rank's chunk into it;
  `use_views()` then puts views of `full` back where the parameters were (tied parameters at
  every place they were used), so autograd sends their gradients into `full.grad` (flat).
- `reshard()` frees `full`'s storage (`untyped_storage().resize_(0)`) while keeping the
  tensor: views that autograd saved for backward still point at it, and see the values
  again once backward re-gathers them into the same storage.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import comm
from ..zero.flat import FlatShard


class FlatParamUnit:
    """The flat parameter of `module`'s trainable parameters in `params` (name -> parameter)."""

    def __init__(
        self,
        index: int,
        module: nn.Module,
        params: dict[str, nn.Parameter],
        group,
        param_dtype: torch.dtype | None = None,
    ):
        self.index, self.module, self.group = index, module, group
        self.names = list(params)
        values = list(params.values())
        self.layout = FlatShard(values, dist.get_world_size(group), dist.get_rank(group))
        flat = self.layout.flatten([p.detach() for p in values])
        self.shard = nn.Parameter(self.layout.own(flat).clone())  # fp32 master chunk
        # the leaf autograd accumulates the flat gradient into, in the compute dtype
        self.full = nn.Parameter(flat.to(param_dtype or flat.dtype))
        self.places = _places(module, values)  # where each parameter was (tied: several)
        for owner, attr, _ in self.places:
            delattr(owner, attr)
        self.pending_gather = None
        self.gathered = True
        self.reshard()

    @property
    def numel(self) -> int:
        return self.layout.numel

    @torch.no_grad()
    def unshard(self, async_op: bool = False) -> None:
        """Gather the full flat parameter (already there, or in flight: nothing to do)."""
        if self.gathered or self.pending_gather is not None:
            return
        storage = self.full.untyped_storage()
        storage.resize_(self.layout.padded * self.full.element_size())
        work = comm.all_gather(  # in the compute dtype: the cast is made just before use
            self.full.data,
            self.shard.detach().to(self.full.dtype),
            group=self.group,
            async_op=True,
            tag=f"unit{self.index}-params",
        )
        self.pending_gather = work
        if not async_op:
            self.wait()

    def wait(self) -> None:
        if self.pending_gather is not None:
            self.pending_gather.wait()
            self.pending_gather = None
            self.gathered = True

    def use_views(self) -> None:
        """Put views of the gathered flat parameter where the original parameters were."""
        views = self.layout.views(self.full)
        for owner, attr, i in self.places:
            setattr(owner, attr, views[i])

    def reshard(self) -> None:
        """Free the full parameter's storage; this rank keeps only its chunk."""
        self.wait()
        self.full.untyped_storage().resize_(0)
        self.gathered = False

    @torch.no_grad()
    def gathered_copy(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """All-gather chunks like `tensor` (this rank's) into new full tensors per parameter."""
        full = torch.empty(self.layout.padded, dtype=tensor.dtype, device=tensor.device)
        comm.all_gather(full, tensor.detach(), group=self.group, tag="full-state")
        return [v.clone() for v in self.layout.views(full)]


def _places(module: nn.Module, params: list[nn.Parameter]) -> list[tuple[nn.Module, str, int]]:
    """(owning module, attribute, index in params) for every registration of every param."""
    index = {id(p): i for i, p in enumerate(params)}
    return [
        (owner, attr, index[id(p)])
        for owner in module.modules()
        for attr, p in list(owner._parameters.items())
        if p is not None and id(p) in index
    ]
