"""Bucketed, overlapped data parallelism: what `torch.nn.parallel.DistributedDataParallel` does.

Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel Training"
(VLDB), section 3.2 (gradient bucketing, overlapping computation with communication) and 3.3
(the Reducer).

- Buckets: parameters are grouped in *reverse registration order* (roughly the order in
  which backward produces their gradients) into flat buffers; a bucket closes once its
  bytes reach `bucket_cap_mb` (so it may exceed the cap by its last parameter); the first
  bucket closes at `first_bucket_cap_mb` so communication starts early.
- Hooks: a post-accumulate-grad hook on every parameter hands its gradient to its
  `GradBucket` (the class the exercise of lesson 01 builds), which copies it into its slot
  (afterwards `param.grad` *is* that slot, so later steps skip the copy) and counts the
  gradients still pending. When none is, the bucket is ready.
- Order: ready buckets are launched strictly in index order (pre-divided by N, one async
  all-reduce each), so every rank issues the same collectives in the same order even when
  gradients become ready in a different order on different ranks.
- End of backward: a callback queued on the autograd engine waits for every bucket.
- `no_sync()`: gradients accumulate locally; the next synchronised backward reduces the sum.
  It sets `require_backward_grad_sync`, the flag torch's DDP has (nanoGPT sets it directly).
- Frozen parameters (requires_grad=False) are left out. Parameters unused in a forward need
  `find_unused_parameters=True`: the autograd graph is walked after forward, unused ones
  contribute zeros, and one small all-reduce of "has a gradient" flags keeps `grad=None`
  for parameters no rank produced a gradient for (as one process would).
- Tied parameters are registered once and their hook fires once, after autograd has summed
  the contributions of every use.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import comm
from ..parallel import ParallelModule, broadcast_parameters, verify_same_model
from ..policy import (
    MixedPrecision,
    cast_floating,
    cast_module_state,
    divide_factors,
    tree_tensors,
)
from .buckets import GradBucket, MiB, plan_buckets


class BucketedDataParallel(ParallelModule):
    """DDP with gradient buckets whose all-reduces overlap the rest of backward."""

    supports_no_sync = True

    def __init__(
        self,
        module: nn.Module,
        group=None,
        bucket_cap_mb: float = 25.0,
        first_bucket_cap_mb: float = 1.0,
        find_unused_parameters: bool = False,
        mixed_precision: MixedPrecision | None = None,
    ):
        """`mixed_precision`: the module computes in `param_dtype` (its parameters become
        copies, refreshed from fp32 masters at every forward), gradients are reduced in
        `reduce_dtype` with pre/post-divide factors; build the optimizer on
        `master_parameters()` (the fp32 masters; the module's own parameters without it)."""
        super().__init__()
        if bucket_cap_mb <= 0 or first_bucket_cap_mb <= 0:
            raise ValueError(
                f"bucket_cap_mb={bucket_cap_mb} and first_bucket_cap_mb={first_bucket_cap_mb} "
                "must both be > 0"
            )
        verify_same_model(module, group, "BucketedDataParallel")
        self.module = module
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.find_unused_parameters = find_unused_parameters
        broadcast_parameters(module, group)

        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.param_names = {id(p): n for n, p in named}
        self.params = [p for _, p in named]
        self.mixed_precision = mixed_precision
        self.masters = nn.ParameterList()
        if mixed_precision is not None:
            self.masters.extend(nn.Parameter(p.detach().float().clone()) for p in self.params)
            cast_module_state(module, mixed_precision.param_dtype, mixed_precision.buffer_dtype)
        self.pre_divide, self.post_divide = (
            divide_factors(self.world_size) if mixed_precision else (float(self.world_size), 1.0)
        )
        reduce_dtype = mixed_precision.reduce_dtype if mixed_precision else None
        plan = plan_buckets(self.params, int(bucket_cap_mb * MiB), int(first_bucket_cap_mb * MiB))
        self.buckets = [
            GradBucket(b, [self.params[i] for i in indices], reduce_dtype)
            for b, indices in enumerate(plan)
        ]
        self.bucket_of = {id(p): bucket for bucket in self.buckets for p in bucket.params}
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)
        self._reset()

    # -- forward ------------------------------------------------------------------------
    def master_parameters(self) -> list[nn.Parameter]:
        """What the optimizer steps: the fp32 masters with mixed precision, else the module's
        trainable parameters."""
        return list(self.masters) if self.mixed_precision else list(self.params)

    def forward(self, *args, **kwargs):
        policy = self.mixed_precision
        if policy is not None:  # compute copies made just before use
            with torch.no_grad():
                for p, master in zip(self.params, self.masters):
                    p.copy_(master)
            args, kwargs = cast_floating((args, kwargs), policy.param_dtype)
        out = self.module(*args, **kwargs)
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            self._reset()
            if self.find_unused_parameters:
                self.unused = self._unused_params(out)
        return out if policy is None else cast_floating(out, torch.float32)

    def _reset(self) -> None:
        for bucket in self.buckets:
            bucket.reset()
        self.next_bucket = 0
        self.backward_started = False
        self.unused: list[torch.Tensor] = []

    def _unused_params(self, out) -> list[torch.Tensor]:
        """Parameters the autograd graph of `out` does not reach."""
        return unreached_parameters(out, self.params)

    # -- backward -----------------------------------------------------------------------
    @torch.no_grad()
    def _on_grad_ready(self, param: torch.Tensor) -> None:
        if not self.require_backward_grad_sync:
            return
        if not self.backward_started:
            self.backward_started = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finalize)
            for p in self.unused:  # they contribute zeros (or a no_sync-accumulated gradient)
                self.bucket_of[id(p)].on_grad_ready(p)
        self.bucket_of[id(param)].on_grad_ready(param)
        # Launch in index order only: every rank must issue the same collectives in order.
        while self.next_bucket < len(self.buckets) and self.buckets[self.next_bucket].pending == 0:
            self.buckets[self.next_bucket].launch(self.pre_divide, self.group)
            self.next_bucket += 1

    @torch.no_grad()
    def _finalize(self) -> None:
        if self.next_bucket < len(self.buckets):
            missing = [
                self.param_names[id(p)]
                for bucket in self.buckets[self.next_bucket :]
                for p in bucket.params
                if id(p) not in bucket.arrived
            ]
            raise RuntimeError(
                f"BucketedDataParallel: parameters {missing} received no gradient in this "
                "backward, so their buckets were never reduced. Pass "
                "find_unused_parameters=True if some parameters are unused in forward."
            )
        for bucket in self.buckets:
            bucket.wait()
            if self.post_divide != 1.0:
                bucket.buffer.div_(self.post_divide)
        if self.mixed_precision is not None:  # the masters step; the copies keep no gradient
            for p, master in zip(self.params, self.masters):
                master.grad = self.bucket_of[id(p)].slots[id(p)].float()
                p.grad = None
        if self.find_unused_parameters:
            self._resolve_unused()

    def _resolve_unused(self) -> None:
        """Which ranks had a gradient for each parameter: one flag per parameter, summed.

        Over *all* parameters, so that every rank makes this call whatever it left unused.
        """
        has_grad = torch.tensor(
            [float(id(p) in self.bucket_of[id(p)].had_grad) for p in self.params],
            device=self.buckets[0].buffer.device,
        )
        comm.all_reduce(has_grad, group=self.group, tag="unused-flags")
        unused = {id(p) for p in self.unused}
        targets = self.master_parameters()
        for p, target, flag in zip(self.params, targets, has_grad.tolist()):
            if id(p) in unused:
                slot = self.bucket_of[id(p)].slots[id(p)]
                target.grad = (
                    (slot if slot.dtype == target.dtype else slot.float()) if flag else None
                )

    def memory_tensors(self) -> dict:
        """Parameters (and fp32 masters), gradients and the flat gradient buckets they live
        in (`minidist.memory.state_bytes`)."""
        held = super().memory_tensors()
        held["grads"] += [b.buffer for b in self.buckets]
        return held

    # -- the comparison contract: with mixed precision, the fp32 masters ------------------
    def full_parameters(self) -> dict[str, torch.Tensor]:
        if self.mixed_precision is None:
            return super().full_parameters()
        out = {
            n: p.detach().to(torch.float32, copy=True) for n, p in self.module.named_parameters()
        }
        out.update(
            {self.param_names[id(p)]: m.detach().clone() for p, m in zip(self.params, self.masters)}
        )
        return out

    def full_grads(self) -> dict[str, torch.Tensor]:
        if self.mixed_precision is None:
            return super().full_grads()
        return {
            self.param_names[id(p)]: m.grad.clone()
            for p, m in zip(self.params, self.masters)
            if m.grad is not None
        }


def unreached_parameters(out, params: list[torch.Tensor]) -> list[torch.Tensor]:
    """The parameters of `params` that the autograd graph of `out` (any structure: tuples,
    dicts, dataclasses such as a `CausalLMOutput`) does not reach: unused in forward."""
    stack = [t.grad_fn for t in tree_tensors(out) if t.grad_fn is not None]
    seen, reached = set(), set()
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if hasattr(fn, "variable"):
            reached.add(id(fn.variable))
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return [p for p in params if id(p) not in reached]
