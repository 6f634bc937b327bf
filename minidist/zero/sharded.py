"""ZeRO stages 1 and 2, and cross-replica weight-update sharding: shard the optimizer's work.

Rajbhandari et al. 2020, "ZeRO", section 5.1 (P_os: optimizer states partitioned, stage 1)
and 5.2 (P_os+g: gradients partitioned too, stage 2); Xu et al. 2020, "Automatic
Cross-Replica Sharding of Weight Update in Data-Parallel Training" (arXiv:2004.13336),
sections 3-4, the same idea seen from the all-reduce: replace it by its two halves. Every
rank holds the whole model, runs forward and backward on its slice of the batch, then:
1. reduce-scatter: each bucket of gradients (DDP's buckets, `plan_buckets`) is summed over
   the ranks and rank r keeps only chunk r of it (`FlatShard`: flattened, padded to a
   multiple of N). Stage 1 keeps the full local gradient buffers; stage 2 launches each
   bucket's reduce-scatter from the gradient hooks as soon as the bucket is complete (in
   bucket order, overlapping backward) and frees the full gradients: only 1/N stays.
2. update: the wrapped torch optimizer (any class; param groups with their own
   hyperparameters) steps only this rank's chunks, so its state is 1/N of the model's.
3. all-gather: the updated chunks travel back into every rank's full parameters, right
   after the step or, with `gather_weights="before_forward"`, at the start of the next
   forward (Xu et al.: it lets the next forward overlap or use another precision).

Per step a rank sends (N-1)/N·Ψ twice, as plain DP's all-reduce. A non-elementwise step (a
global gradient norm: clipping, LAMB) sums partial results over the shards with one
all-reduce, the padding masked out (`clip_grad_norm_`, in `sharded_optimizer.py` with the
optimizer wrapper). Parameters unused in forward need `find_unused_parameters=True` (as in
DDP). Not here: `no_sync`, stage 3 (FSDP, notebook 03). Native equivalents:
`torch.distributed.optim.ZeroRedundancyOptimizer` (stage 1), DeepSpeed ZeRO stages 1-2.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import comm
from ..data_parallel.bucketed import unreached_parameters
from ..data_parallel.buckets import MiB, plan_buckets
from ..parallel import ParallelModule, broadcast_parameters, verify_same_model
from ..policy import (
    MixedPrecision,
    cast_floating,
    cast_module_state,
    divide_factors,
)
from .flat import ShardedBucket
from .sharded_optimizer import (
    ShardedOptimizer,
    _group_index,
    check_optimizer_used,
    clip_sharded_grad_norm_,
    parameter_versions,
)

GATHER_WHEN = ("after_step", "before_forward")


class ZeroDataParallel(ParallelModule):
    """ZeRO stage 1 or 2 around `module`; `self.optimizer` steps only this rank's shard.

    Args:
        module: the model, the same on every rank (checked).
        stage: 1 (optimizer state sharded) or 2 (gradients sharded too).
        optimizer_class: any torch optimizer class; built on this rank's chunks.
        param_groups: torch-style groups, e.g. `[{"params": [...], "lr": 0.1}, ...]`, that
            together list every trainable parameter once; default one group of them all.
        bucket_cap_mb: gradient bucket size, as in DDP.
        gather_weights: "after_step" or "before_forward" (when updated chunks are gathered).
        mixed_precision: the module computes in `param_dtype` (its parameters and frozen ones
            become copies in that dtype, buffers only with `buffer_dtype`; inputs cast to it,
            the output to fp32, any structure kept),
            gradients are reduced in `reduce_dtype` and kept in `param_dtype`; the optimizer
            steps fp32 master chunks (`minidist.mixed_precision`).
        find_unused_parameters: as DDP's: after each forward, the parameters its graph does
            not reach count as ready with a zero gradient. (A flat chunk steps whole, so the
            optimizer sees a zero where DDP would leave `.grad` None: equal for Adam's first
            steps, not with momentum or weight decay already on that parameter.)
        **defaults: the optimizer's hyperparameters (lr, betas, weight_decay, ...).
    """

    def __init__(
        self,
        module: nn.Module,
        stage: int = 1,
        optimizer_class: type[torch.optim.Optimizer] = torch.optim.Adam,
        param_groups: list[dict] | None = None,
        group=None,
        bucket_cap_mb: float = 25.0,
        gather_weights: str = "after_step",
        mixed_precision: MixedPrecision | None = None,
        find_unused_parameters: bool = False,
        **defaults,
    ):
        super().__init__()
        if stage not in (1, 2):
            raise ValueError(f"ZeroDataParallel: stage must be 1 or 2 (3 is FSDP), got {stage}")
        if gather_weights not in GATHER_WHEN:
            raise ValueError(f"gather_weights must be one of {GATHER_WHEN}, got {gather_weights!r}")
        if bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb={bucket_cap_mb} must be > 0")
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        groups = _group_index(named, param_groups)
        verify_same_model(module, group, "ZeroDataParallel")
        self.module, self.group, self.stage = module, group, stage
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.gather_weights, self.mixed_precision = gather_weights, mixed_precision
        self.find_unused_parameters = find_unused_parameters
        broadcast_parameters(module, group)
        dtype = mixed_precision.param_dtype if mixed_precision else None

        params = [p for _, p in named]
        cap = int(bucket_cap_mb * MiB)
        plan = plan_buckets(params, cap, cap, groups=[groups[id(p)] for p in params])
        self.buckets = [
            ShardedBucket(
                [named[i][0] for i in idx], [params[i] for i in idx], self.world, self.rank, dtype
            )
            for idx in plan
        ]
        if dtype is not None:
            cast_module_state(module, dtype, mixed_precision.buffer_dtype)
        self.slot_of = {id(p): (b, i) for b in self.buckets for i, p in enumerate(b.params)}
        for p in params:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)
        options = param_groups or [{}]
        inner_groups = [
            {**{k: v for k, v in options[g].items() if k != "params"}, "params": shards}
            for g in range(len(options))
            if (shards := [b.shard for b in self.buckets if groups[id(b.params[0])] == g])
        ]
        self.optimizer = ShardedOptimizer(
            optimizer_class(inner_groups, **defaults),
            module,
            self.buckets,
            self._after_step,
            self._gradients_cleared,
        )
        self.pre_divide, self.post_divide = (
            divide_factors(self.world) if mixed_precision else (float(self.world), 1.0)
        )
        self._gather_pending = False
        self._grads_used = True  # the last backward's gradients were stepped or cleared
        self._reset()
        self._versions = parameter_versions(self.buckets)

    @property
    def shards(self) -> list[nn.Parameter]:
        """This rank's chunks, one per bucket: what the optimizer steps."""
        return [b.shard for b in self.buckets]

    # -- forward and backward -----------------------------------------------------------------
    def forward(self, *args, **kwargs):
        check_optimizer_used(self.buckets, self._versions, self._grads_used)
        if self._gather_pending:
            self.gather_parameters()
        if torch.is_grad_enabled():
            self._reset()
        policy = self.mixed_precision
        if policy is not None:
            args, kwargs = cast_floating((args, kwargs), policy.param_dtype)
        out = self.module(*args, **kwargs)
        if self.find_unused_parameters and torch.is_grad_enabled():
            self.unused = unreached_parameters(out, [p for b in self.buckets for p in b.params])
        return out if policy is None else cast_floating(out, torch.float32)

    def _reset(self) -> None:
        for b in self.buckets:
            b.pending, b.work, b.arrived = len(b.params), None, set()
        self.next_bucket = 0
        self.backward_started = False
        self.unused: list[nn.Parameter] = []

    @torch.no_grad()
    def _on_grad_ready(self, param: torch.Tensor) -> None:
        if not self.backward_started:
            self.backward_started = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
            for p in self.unused:  # find_unused_parameters: ready now, with a zero gradient
                self._arrive(p, None)
        self._arrive(param, param.grad)
        # Launch in bucket order only, so every rank issues the same collectives in order.
        while self.next_bucket < len(self.buckets) and self.buckets[self.next_bucket].pending == 0:
            ready = self.buckets[self.next_bucket]
            grad = ready.flat_grad
            if self.mixed_precision is not None:
                grad = grad.to(self.mixed_precision.reduce_dtype)
            grad.div_(self.pre_divide)  # the sum of the pre-divided parts, post-divided: mean
            ready.reduced = grad.new_empty(ready.layout.chunk)
            ready.work = comm.reduce_scatter(
                ready.reduced,
                grad,
                group=self.group,
                async_op=True,
                tag=f"grad-bucket{self.next_bucket}",
            )
            self.next_bucket += 1

    def _arrive(self, param: nn.Parameter, grad: torch.Tensor | None) -> None:
        """`param`'s gradient (None: unused, zero) into its slot of the flat gradient."""
        b, i = self.slot_of[id(param)]
        if b.flat_grad is None:  # stage 2 allocates it per backward, stage 1 once
            b.flat_grad = torch.zeros_like(b.flat_param)
            b.grad_views = b.layout.views(b.flat_grad)  # once per buffer, not per parameter
        view = b.grad_views[i]
        if grad is None:
            view.zero_()
        elif grad.data_ptr() != view.data_ptr():
            view.copy_(grad)
        if grad is not None:
            param.grad = view if self.stage == 1 else None  # stage 2 keeps no full gradient
        b.arrived.add(i)
        b.pending -= 1

    @torch.no_grad()
    def _finish_backward(self) -> None:
        if self.next_bucket < len(self.buckets):
            missing = [n for b in self.buckets for i, n in enumerate(b.names) if i not in b.arrived]
            raise RuntimeError(
                f"ZeroDataParallel: parameters {missing} received no gradient in this backward "
                "on this rank, so their buckets were never reduced. Pass "
                "find_unused_parameters=True if some parameters are unused in forward (as "
                "to torch's DistributedDataParallel)."
            )
        for b in self.buckets:
            b.work.wait()
            reduced = b.reduced.div_(self.post_divide) if self.post_divide != 1 else b.reduced
            if self.stage == 1:  # the reduced chunk replaces this rank's part of the buffer
                b.grad_chunk = b.layout.own(b.flat_grad)
                b.grad_chunk.copy_(reduced)
            else:
                b.grad_chunk = reduced.to(b.flat_grad.dtype)
                b.flat_grad = None
            if b.grad_chunk.dtype == b.shard.dtype:
                b.shard.grad = b.grad_chunk  # else cast for the step only (`ShardedOptimizer`)
            b.reduced = None
        self._grads_used = False

    # -- the step -------------------------------------------------------------------------------
    def _gradients_cleared(self) -> None:
        self._grads_used = True

    @torch.no_grad()
    def _after_step(self) -> None:
        """The updated chunks are gathered now, or before the next forward."""
        self._grads_used = True
        if self.gather_weights == "after_step":
            self.gather_parameters()
        else:
            self._gather_pending = True

    def gather_parameters(self) -> None:
        """All-gather every bucket's updated chunks into the full parameters."""
        works = [
            comm.all_gather(  # in the compute dtype, from a copy of the (master) chunk
                b.flat_param,
                b.shard.detach().to(b.flat_param.dtype, copy=True),
                group=self.group,
                async_op=True,
                tag="params",
            )
            for b in self.buckets
        ]
        for w in works:
            w.wait()
        self._gather_pending = False
        self._versions = parameter_versions(self.buckets)

    def clip_grad_norm_(self, max_norm: float) -> float:
        """Scale the sharded gradients so their global L2 norm is at most `max_norm`; returns
        the norm before clipping (see `clip_sharded_grad_norm_`)."""
        return clip_sharded_grad_norm_(
            [(b.layout, b.grad_chunk) for b in self.buckets], max_norm, self.group
        )

    def memory_tensors(self) -> dict:
        """The module's parameters, this rank's chunks, the flat gradients and reduced chunks,
        and the wrapper's optimizer (`minidist.memory.state_bytes`)."""
        held = super().memory_tensors()
        held["params"] += self.shards
        held["grads"] += [b.flat_grad for b in self.buckets if b.flat_grad is not None]
        held["grads"] += [b.grad_chunk for b in self.buckets if b.grad_chunk is not None]
        held["optimizer"] = self.optimizer
        return held

    # -- the comparison contract --------------------------------------------------------------
    def full_parameters(self) -> dict[str, torch.Tensor]:
        """fp32: the module's parameters, or with mixed precision the gathered masters."""
        if self.mixed_precision is None:
            if self._gather_pending:
                self.gather_parameters()
            return super().full_parameters()
        out = {n: p.detach().float() for n, p in self.module.named_parameters()}  # frozen
        for b in self.buckets:
            out.update(zip(b.names, self._gathered(b, b.shard)))
        return out

    def full_grads(self) -> dict[str, torch.Tensor]:
        """The averaged gradients (fp32), gathered from every rank's chunk."""
        out = {}
        for b in self.buckets:
            if b.grad_chunk is not None:
                out.update(zip(b.names, self._gathered(b, b.grad_chunk)))
        return out

    @torch.no_grad()
    def _gathered(self, b: ShardedBucket, chunk: torch.Tensor) -> list[torch.Tensor]:
        full = torch.empty(b.layout.padded, dtype=torch.float32, device=chunk.device)
        comm.all_gather(full, chunk.detach().float(), group=self.group, tag="full-grads")
        return [v.clone() for v in b.layout.views(full)]
