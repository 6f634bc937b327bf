"""Bucketed, overlapped data parallelism: what `torch.nn.parallel.DistributedDataParallel` does.

Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel Training",
section 3.2 (gradient bucketing, overlapping computation with communication) and 3.3
(the Reducer). SYLLABUS section 1.

- Buckets: parameters are grouped in *reverse registration order* (roughly the order in
  which backward produces their gradients) into flat buffers of about `bucket_cap_mb`; the
  first bucket is capped at `first_bucket_cap_mb` so communication starts early.
- Hooks: a post-accumulate-grad hook on every parameter copies its gradient into its slot
  of the bucket (afterwards `param.grad` *is* that slot, so later steps skip the copy).
  When a bucket's last gradient arrives the bucket is pre-divided by N and its all-reduce
  is launched asynchronously, while autograd keeps computing earlier layers.
- Order: buckets are launched strictly in index order, so every rank issues the same
  collectives in the same order even if gradients become ready in a different order.
- End of backward: a callback queued on the autograd engine waits for every bucket.
- `no_sync()`: gradients accumulate locally; the next synchronised backward reduces the sum.
- Frozen parameters (requires_grad=False) are left out. Parameters unused in a forward need
  `find_unused_parameters=True`: the autograd graph is walked after forward, unused ones
  contribute zeros, and one small all-reduce of "has a gradient" flags keeps `grad=None`
  for parameters no rank produced a gradient for (as one process would).
- Tied parameters are registered once and their hook fires once, after autograd has summed
  the contributions of every use.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import comm
from .naive import broadcast_parameters

MiB = 1024 * 1024


def plan_buckets(
    params: list[torch.Tensor], cap_bytes: int, first_cap_bytes: int
) -> list[list[int]]:
    """Indices of `params` per bucket: reverse order, a bucket closes once it reaches its cap.

    A bucket may exceed its cap by its last parameter (as in PyTorch); dtypes never mix.
    """
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in reversed(range(len(params))):
        p = params[i]
        if current and params[current[0]].dtype != p.dtype:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += p.numel() * p.element_size()
        if size >= (first_cap_bytes if not buckets else cap_bytes):
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


@dataclass
class Bucket:
    param_indices: list[int]
    buffer: torch.Tensor
    views: list[torch.Tensor]
    pending: int = 0
    work: object = None
    ready_order: list[int] = field(default_factory=list)


class BucketedDataParallel(nn.Module):
    """DDP with gradient buckets whose all-reduces overlap the rest of backward."""

    def __init__(
        self,
        module: nn.Module,
        group=None,
        bucket_cap_mb: float = 25.0,
        first_bucket_cap_mb: float = 1.0,
        find_unused_parameters: bool = False,
    ):
        super().__init__()
        if bucket_cap_mb <= 0 or first_bucket_cap_mb <= 0:
            raise ValueError(
                f"bucket_cap_mb={bucket_cap_mb} and first_bucket_cap_mb={first_bucket_cap_mb} "
                "must both be > 0"
            )
        self.module = module
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.find_unused_parameters = find_unused_parameters
        self.require_grad_sync = True
        broadcast_parameters(
            module, src=dist.get_global_rank(group, 0) if group else 0, group=group
        )

        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.param_names = [n for n, _ in named]
        self.params = [p for _, p in named]
        plan = plan_buckets(self.params, int(bucket_cap_mb * MiB), int(first_bucket_cap_mb * MiB))
        self.buckets: list[Bucket] = []
        self.slot: dict[int, tuple[int, int]] = {}  # param index -> (bucket, position)
        for b, indices in enumerate(plan):
            dtype = self.params[indices[0]].dtype
            buffer = torch.zeros(
                sum(self.params[i].numel() for i in indices), dtype=dtype,
                device=self.params[indices[0]].device,
            )  # fmt: skip
            views, offset = [], 0
            for pos, i in enumerate(indices):
                n = self.params[i].numel()
                views.append(buffer[offset : offset + n].view_as(self.params[i]))
                offset += n
                self.slot[i] = (b, pos)
            self.buckets.append(Bucket(indices, buffer, views))
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(lambda p, i=i: self._on_grad_ready(i))
        self._reset()
        self.last_backward_end: float | None = None

    # -- forward ------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        out = self.module(*args, **kwargs)
        if torch.is_grad_enabled() and self.require_grad_sync:
            self._reset()
            if self.find_unused_parameters:
                self.unused = self._unused_params(out)
        return out

    def _reset(self) -> None:
        for b in self.buckets:
            b.pending = len(b.param_indices)
            b.work = None
            b.ready_order = []
        self.next_bucket = 0
        self.backward_started = False
        self.unused: list[int] = []

    def _unused_params(self, out) -> list[int]:
        """Parameters the autograd graph of `out` does not reach."""
        outputs = out if isinstance(out, (tuple, list)) else [out]
        stack = [t.grad_fn for t in outputs if isinstance(t, torch.Tensor) and t.grad_fn]
        seen, reached = set(), set()
        while stack:
            fn = stack.pop()
            if fn is None or fn in seen:
                continue
            seen.add(fn)
            if hasattr(fn, "variable"):
                reached.add(id(fn.variable))
            stack.extend(next_fn for next_fn, _ in fn.next_functions)
        return [i for i, p in enumerate(self.params) if id(p) not in reached]

    # -- backward -----------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally; the first backward after the block reduces them."""
        previous, self.require_grad_sync = self.require_grad_sync, False
        try:
            yield
        finally:
            self.require_grad_sync = previous

    @torch.no_grad()
    def _on_grad_ready(self, index: int) -> None:
        if not self.require_grad_sync:
            return
        if not self.backward_started:
            self.backward_started = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finalize)
            for i in self.unused:
                self._contribute_unused(i)
        b, pos = self.slot[index]
        p, view = self.params[index], self.buckets[b].views[pos]
        if p.grad.data_ptr() != view.data_ptr():
            view.copy_(p.grad)
            p.grad = view
        self._mark_ready(b, index)

    def _contribute_unused(self, index: int) -> None:
        b, pos = self.slot[index]
        grad = self.params[index].grad
        view = self.buckets[b].views[pos]
        if grad is None:
            view.zero_()
        elif grad.data_ptr() != view.data_ptr():
            view.copy_(grad)
        self._mark_ready(b, index)

    def _mark_ready(self, b: int, index: int) -> None:
        bucket = self.buckets[b]
        bucket.pending -= 1
        bucket.ready_order.append(index)
        # Launch in index order only: every rank must issue the same collectives in order.
        while self.next_bucket < len(self.buckets) and self.buckets[self.next_bucket].pending == 0:
            ready = self.buckets[self.next_bucket]
            ready.buffer.div_(self.world_size)  # pre-divide: the sum is then the mean
            ready.work = comm.all_reduce(
                ready.buffer, group=self.group, async_op=True, tag=f"bucket{self.next_bucket}"
            )
            self.next_bucket += 1

    @torch.no_grad()
    def _finalize(self) -> None:
        self.last_backward_end = time.perf_counter()
        if self.next_bucket < len(self.buckets):
            missing = [
                self.param_names[i]
                for b in self.buckets[self.next_bucket :]
                for i in b.param_indices
                if i not in b.ready_order
            ]
            raise RuntimeError(
                f"BucketedDataParallel: parameters {missing} received no gradient in this "
                "backward, so their buckets were never reduced. Pass "
                "find_unused_parameters=True if some parameters are unused in forward."
            )
        for bucket in self.buckets:
            bucket.work.wait()
        if self.find_unused_parameters:
            self._resolve_unused()

    def _resolve_unused(self) -> None:
        """Which ranks had a gradient for each parameter: one flag per parameter, summed.

        Over *all* parameters, so that every rank makes this call whatever it left unused.
        """
        has_grad = torch.tensor(
            [float(p.grad is not None) for p in self.params], device=self.buckets[0].buffer.device
        )
        comm.all_reduce(has_grad, group=self.group, tag="unused-flags")
        for i in self.unused:
            b, pos = self.slot[i]
            self.params[i].grad = self.buckets[b].views[pos] if has_grad[i] > 0 else None
