"""The step of ZeRO stages 1-2 over sharded state: the optimizer on this rank's chunks, its
param groups, and the global gradient norm summed over the shards.

Rajbhandari et al. 2020, "ZeRO", section 5.1 (P_os: each rank updates only its partition of
the optimizer states); Xu et al. 2020, "Automatic Cross-Replica Sharding of Weight Update in
Data-Parallel Training" (arXiv:2004.13336), section 4.3: a non-elementwise step (a global
gradient norm, as in clipping or LAMB) sums partial results over the shards with one
all-reduce.

- `ShardedOptimizer`: what `ZeroDataParallel.optimizer` is; any torch optimizer stepping the
  chunks, then the all-gather of the updated parameters (after the step or before the next
  forward);
- `clip_sharded_grad_norm_`: clipping by the global L2 norm of gradients held as chunks of
  flat buffers, padding masked out (also FSDP's);
- `_group_index`: which torch-style param group each trainable parameter is in, checked;
- `check_optimizer_used`: refuses a loop that stepped an optimizer of its own instead.

Not here: the buckets, hooks and collectives of the gradients (`sharded.py`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn

from .. import comm
from ..training import OptimizerWrapper
from .flat import FlatShard


@torch.no_grad()
def clip_sharded_grad_norm_(
    chunks: list[tuple[FlatShard, torch.Tensor | None]], max_norm: float, group=None
) -> float:
    """Clip gradients held as chunks of flat buffers by their global L2 norm.

    A non-elementwise step over sharded state (Xu et al. 2020, section 4.3): each rank sums
    the squares of its chunks with the padding masked out, one all-reduce adds the partial
    sums, and every rank scales its chunks by the same factor. Returns the norm.
    """
    if max_norm <= 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm}")
    dev = next((g.device for _, g in chunks if g is not None), comm.group_device(group))
    partial = torch.zeros((), device=dev)
    for layout, grad in chunks:
        if grad is not None:
            partial += grad[layout.valid(dev)].float().pow(2).sum()
    comm.all_reduce(partial, group=group, tag="grad-norm")
    norm = math.sqrt(float(partial))
    if norm > max_norm:
        for _, grad in chunks:
            if grad is not None:
                grad.mul_(max_norm / (norm + 1e-6))
    return norm


class ShardedOptimizer(OptimizerWrapper):
    """What `ZeroDataParallel.optimizer` is: the inner optimizer on this rank's chunks, then
    the gather of the updated chunks. Mirrors the torch optimizer API the loops use.

    It works on the data it is given: the wrapped `module` (whose gradients it clears), the
    `buckets` (each with a `shard` parameter and a reduced `grad_chunk`) and `after_step`,
    which gathers the updated chunks now or marks them for the next forward."""

    def __init__(
        self,
        inner: torch.optim.Optimizer,
        module: nn.Module,
        buckets: list,
        after_step: Callable[[], None],
        on_zero_grad: Callable[[], None] = lambda: None,
    ):
        self.inner, self.module, self.buckets, self.after_step = inner, module, buckets, after_step
        self.on_zero_grad = on_zero_grad  # the wrapper notes that the gradients were cleared

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)
        for p in self.module.parameters():
            p.grad = None
        for b in self.buckets:
            b.grad_chunk = None
        self.on_zero_grad()

    def gradients(self) -> list[torch.Tensor]:
        """This rank's reduced gradient chunks, the ones the step will use (in the compute
        dtype with mixed precision): what a loss scaler unscales and checks."""
        return [b.grad_chunk for b in self.buckets if b.grad_chunk is not None]

    def step(self) -> None:
        casts = [b for b in self.buckets if b.grad_chunk is not None and b.shard.grad is None]
        for b in casts:  # mixed precision: the fp32 gradient exists during the step only
            b.shard.grad = b.grad_chunk.float()
        self.inner.step()
        for b in casts:
            b.shard.grad = None
        self.after_step()


def _group_index(named: list[tuple[str, nn.Parameter]], param_groups) -> dict[int, int]:
    """id(param) -> index of its param group; every trainable parameter in exactly one."""
    if param_groups is None:
        return {id(p): 0 for _, p in named}
    name_of = {id(p): n for n, p in named}
    index: dict[int, int] = {}
    for g, group in enumerate(param_groups):
        for p in group["params"]:
            if id(p) not in name_of:
                raise ValueError(
                    f"param_groups[{g}] lists a tensor that is not a trainable parameter of "
                    "the module"
                )
            if id(p) in index:
                raise ValueError(
                    f"param_groups: {name_of[id(p)]} is in groups {index[id(p)]} and {g}"
                )
            index[id(p)] = g
    missing = [n for n, p in named if id(p) not in index]
    if missing:
        raise ValueError(f"param_groups must list every trainable parameter; missing {missing}")
    return index


def parameter_versions(buckets: list) -> list[int]:
    """In-place version of every trainable parameter as the wrapper left it: an optimizer
    stepping them (instead of the wrapper's stepping the chunks) bumps it."""
    return [p._version for b in buckets for p in b.params]


def check_optimizer_used(buckets: list, versions: list[int], grads_used: bool) -> None:
    """Refuse a step that bypassed `ZeroDataParallel.optimizer` (a `torch.optim.Adam(model.
    parameters())` of one's own beside the wrapper) before it makes the ranks drift apart
    (stage 1) or trains nothing (stage 2, where no parameter has a `.grad`)."""
    params = [(n, p) for b in buckets for n, p in zip(b.names, b.params)]
    changed = [n for (n, p), v in zip(params, versions) if p._version != v]
    rule = (
        "ZeroDataParallel steps its own optimizer on this rank's shards: build it with "
        "ZeroDataParallel(model, stage, optimizer_class=torch.optim.Adam, lr=...) (as "
        "torch's ZeroRedundancyOptimizer), then call zero.optimizer.zero_grad() and "
        "zero.optimizer.step(); an optimizer of your own on model.parameters() bypasses it"
    )
    if changed:
        raise RuntimeError(
            f"ZeroDataParallel: parameter {changed[0]!r} was changed in place since the "
            f"wrapper's last step ({len(changed)} parameters in all). {rule}."
        )
    if not grads_used and torch.is_grad_enabled():
        raise RuntimeError(
            "ZeroDataParallel: a new forward began while the gradients of the last backward "
            "were neither stepped by zero.optimizer.step() nor cleared by "
            f"zero.optimizer.zero_grad(). {rule}."
        )
