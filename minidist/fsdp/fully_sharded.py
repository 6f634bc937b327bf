"""Fully sharded data parallelism (ZeRO stage 3): parameters sharded too, gathered per unit.

Zhao et al. 2023, "PyTorch FSDP" (VLDB), sections 3-4; Rajbhandari et al. 2020, "ZeRO",
section 5.3 (P_os+g+p); hybrid sharding: section 3.2.2 of the FSDP paper, MiCS (Zhang et
al. 2022) and Amazon SageMaker's sharded data parallelism. The model is cut into units
(`wrap(module) -> bool`, e.g. every transformer block; the root takes the rest), each a
`FlatParamUnit`: one flat parameter, padded, of which a rank keeps 1/F (F: the shard group).

- forward: just before a unit runs, all-gather its full parameter (or wait for the gather
  that the previous unit prefetched) and prefetch the next unit's; just after, free it
  (`reshard_after_forward`; the root keeps its parameters, its backward comes first).
- backward: when the gradient of a unit's output arrives, gather the unit again and
  prefetch the one before it; when autograd has accumulated the unit's flat gradient,
  reduce-scatter it (pre-divided by N) into this rank's chunk and free the full gradient and
  parameter. With hybrid sharding the chunk is then all-reduced across the N/F replicas.
- A unit waits for its own gather before it runs, and at most one prefetch is in flight
  (PyTorch FSDP's `limit_all_gathers` bound): at most the root and two units are gathered
  at once, which keeps peak memory at Σψ/N plus about two units.
- `no_sync()`: gradients accumulate unsharded, reduce-scattered at the next synced backward.

Per step a rank sends (N-1)/N of every unit's parameters in forward, again in backward for
units resharded after forward, and its gradients: 3(N-1)/N·Ψ (2 without resharding). A tied
parameter belongs to the smallest unit around all its uses (`_make_units`). Not here: CPU
offload (lesson 05), unused parameters. Native: `torch.distributed.fsdp.fully_shard`.
"""

from __future__ import annotations

from collections.abc import Callable

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
from ..zero.sharded import clip_sharded_grad_norm_
from .unit import FlatParamUnit


class FullyShardedDataParallel(ParallelModule):
    """ZeRO-3 / FSDP around `module`; build the optimizer on `sharded_parameters()`.

    Args:
        module: the model, the same on every rank (checked).
        wrap: which submodules become units (the root always is one); default none.
        reshard_after_forward: free each non-root unit's parameters after its forward.
        prefetch: gather the next unit (forward) / the previous one (backward) ahead.
        hybrid_shard_size: F; shard within groups of F consecutive ranks, replicate across
            the N/F groups (HYBRID_SHARD). Default: shard over all N ranks.
        mixed_precision: compute and all-gather in `param_dtype` (inputs cast to it, the
            output cast back to fp32, any structure kept), reduce gradients in `reduce_dtype`;
            the shards and the optimizer stay fp32 (`minidist.mixed_precision`). Frozen
            parameters, which no unit holds, are kept in `param_dtype`; buffers keep their
            dtype unless `buffer_dtype` says otherwise.
    """

    supports_no_sync = True  # `no_sync()`: gradients accumulate unsharded, reduced later

    def __init__(
        self,
        module: nn.Module,
        wrap: Callable[[nn.Module], bool] | None = None,
        reshard_after_forward: bool = True,
        prefetch: bool = True,
        hybrid_shard_size: int | None = None,
        mixed_precision: MixedPrecision | None = None,
    ):
        super().__init__()
        world = dist.get_world_size()
        if hybrid_shard_size is not None and (hybrid_shard_size < 1 or world % hybrid_shard_size):
            raise ValueError(
                f"hybrid_shard_size={hybrid_shard_size} must be >= 1 and divide the world size "
                f"{world}"
            )
        units = [m for m in module.modules() if m is not module and wrap and wrap(m)]
        for m in [*units, module]:
            if getattr(m, "_minidist_fsdp_unit", False):
                raise ValueError(f"{type(m).__name__} is already an FSDP unit: wrap it once")
        verify_same_model(module, None, "FullyShardedDataParallel")
        broadcast_parameters(module)
        self.module, self.world = module, world
        first = {id(p): n for n, p in module.named_parameters()}
        self.tied = {  # every other name of a tied parameter -> its first name
            n: first[id(p)]
            for n, p in module.named_parameters(remove_duplicate=False)
            if n != first[id(p)]
        }
        self.shard_group, self.replicate_group = _groups(world, hybrid_shard_size or world)
        self.reshard_after_forward, self.prefetch = reshard_after_forward, prefetch
        self.mixed_precision = mixed_precision
        param_dtype = mixed_precision.param_dtype if mixed_precision else None
        self.units = _make_units(units, module, self.shard_group, param_dtype)
        if param_dtype is not None:  # what stays outside the units is cast once, for good
            cast_module_state(module, param_dtype, mixed_precision.buffer_dtype)
        self.shards = nn.ParameterList(u.shard for u in self.units)
        self.root = self.units[-1] if self.units and self.units[-1].module is module else None
        for unit in self.units:
            unit.module._minidist_fsdp_unit = True
            unit.module.register_forward_pre_hook(lambda m, a, u=unit: self._pre_forward(u))
            unit.module.register_forward_hook(lambda m, a, out, u=unit: self._post_forward(u, out))
            unit.full.register_post_accumulate_grad_hook(lambda p, u=unit: self._post_backward(u))
        self.forward_order: list[FlatParamUnit] = []  # of the last forward: what to prefetch
        self._reset()

    def sharded_parameters(self) -> list[nn.Parameter]:
        """What the optimizer steps: every unit's chunk. (`parameters()` adds frozen ones.)"""
        return list(self.shards)

    def forward(self, *args, **kwargs):
        self._reset()
        self._recording: list[FlatParamUnit] = []
        policy = self.mixed_precision
        if policy is not None:
            args, kwargs = cast_floating((args, kwargs), policy.param_dtype)
        out = self.module(*args, **kwargs)
        if torch.is_grad_enabled():
            self.forward_order = self._recording
        return out if policy is None else cast_floating(out, torch.float32)

    def _reset(self) -> None:
        self.backward_started = False
        self.reductions: list[tuple[FlatParamUnit, torch.Tensor, object, float]] = []
        self.pre_backward_done: set[int] = set()

    # -- forward ----------------------------------------------------------------------------
    def _pre_forward(self, unit: FlatParamUnit) -> None:
        self._recording.append(unit)
        unit.unshard()
        unit.wait()
        if self.prefetch:
            self._prefetch(unit, +1)
        unit.use_views()

    def _post_forward(self, unit: FlatParamUnit, out):
        if unit is not self.root and self.reshard_after_forward:
            unit.reshard()
        if torch.is_grad_enabled():
            for t in tree_tensors(out):
                if t.requires_grad:
                    t.register_hook(lambda g, u=unit: self._pre_backward(u))
        return out

    def _prefetch(self, unit: FlatParamUnit, direction: int) -> None:
        """Start the all-gather of the unit after (forward) or before (backward) this one."""
        order = self.forward_order
        if unit not in order:
            return
        i = order.index(unit) + direction
        if 0 <= i < len(order):
            order[i].unshard(async_op=True)

    # -- backward ---------------------------------------------------------------------------
    def _pre_backward(self, unit: FlatParamUnit) -> None:
        if not self.backward_started:
            self.backward_started = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
        if unit.index in self.pre_backward_done:
            return
        self.pre_backward_done.add(unit.index)
        unit.unshard()
        unit.wait()
        if self.prefetch:
            self._prefetch(unit, -1)

    @torch.no_grad()
    def _post_backward(self, unit: FlatParamUnit) -> None:
        if not self.require_backward_grad_sync:
            return  # no_sync: full.grad keeps accumulating, unsharded
        grad = unit.full.grad
        unit.full.grad = None
        unit.reshard()  # its backward is done: parameters and full gradient go
        policy = self.mixed_precision
        pre, post = divide_factors(self.world) if policy else (float(self.world), 1.0)
        if policy is not None:
            grad = grad.to(policy.reduce_dtype)
        grad.div_(pre)  # the sum of the pre-divided parts, post-divided, is the mean
        chunk = torch.empty(unit.layout.chunk, dtype=grad.dtype, device=grad.device)
        work = comm.reduce_scatter(
            chunk, grad, group=self.shard_group, async_op=True, tag=f"unit{unit.index}-grads"
        )
        self.reductions.append((unit, chunk, work, post))

    @torch.no_grad()
    def _finish_backward(self) -> None:
        for unit, chunk, work, post in self.reductions:
            work.wait()
            if self.replicate_group is not None:
                comm.all_reduce(chunk, group=self.replicate_group, tag=f"unit{unit.index}-replicas")
            chunk = chunk.div_(post).float() if post != 1.0 else chunk.float()
            unit.shard.grad = chunk if unit.shard.grad is None else unit.shard.grad + chunk
        for unit in self.units:
            unit.reshard()
        self._reset()

    # -- clipping and the full state --------------------------------------------------------
    def clip_grad_norm_(self, max_norm: float) -> float:
        """Clip by the global gradient norm across the shard group (padding masked out);
        returns the norm before clipping (see `minidist.zero.sharded.clip_sharded_grad_norm_`)."""
        return clip_sharded_grad_norm_(
            [(u.layout, u.shard.grad) for u in self.units], max_norm, self.shard_group
        )

    def memory_tensors(self) -> dict:
        """Chunks, frozen parameters, each unit's flat parameter (its storage is empty unless
        gathered) and gradients (`minidist.memory.state_bytes`)."""
        held = super().memory_tensors()
        held["params"] += [u.full for u in self.units]
        held["grads"] += [u.full.grad for u in self.units if u.full.grad is not None]
        return held

    def full_parameters(self) -> dict[str, torch.Tensor]:
        out = {
            n: p.detach().to(torch.float32, copy=True) for n, p in self.module.named_parameters()
        }
        for u in self.units:
            out.update(zip(u.names, u.gathered_copy(u.shard)))
        return out

    def full_grads(self) -> dict[str, torch.Tensor]:
        out = {}
        for u in self.units:
            if u.shard.grad is not None:
                out.update(zip(u.names, u.gathered_copy(u.shard.grad)))
        return out

    def full_state_dict(self, rank0_only: bool = True) -> dict[str, torch.Tensor]:
        """The single-process model's state dict (parameters and buffers), gathered from the
        shards; every rank takes part, rank 0 (or every rank) gets it."""
        state = {**self.full_parameters(), **dict(self.module.named_buffers())}
        state.update({alias: state[name] for alias, name in self.tied.items()})
        if rank0_only and dist.get_rank() != 0:
            return {}
        return state


def _groups(world: int, shard_size: int):
    """(shard group, replicate group or None) of this rank; every rank creates every group."""
    if shard_size == world:
        return None, None
    rank = dist.get_rank()
    mine = {}
    for g in range(world // shard_size):
        ranks = list(range(g * shard_size, (g + 1) * shard_size))
        group = comm.new_group(ranks, "fsdp shard")
        if rank in ranks:
            mine["shard"] = group
    for i in range(shard_size):
        ranks = list(range(i, world, shard_size))
        group = comm.new_group(ranks, "fsdp replicate")
        if rank in ranks:
            mine["replicate"] = group
    return mine["shard"], mine["replicate"]


def _make_units(
    wrapped: list[nn.Module], root: nn.Module, group, param_dtype=None
) -> list[FlatParamUnit]:
    """One unit per wrapped module and the root. A parameter belongs to the innermost unit
    that holds every place it is registered: a parameter tied across two units (GPT-2's
    `lm_head.weight is transformer.wte.weight` with the embedding wrapped) belongs to the
    smallest unit around both, which is gathered whenever either use runs, so it has one
    owner and one gradient (FSDP1 gives a shared parameter to the common parent the same
    way; FSDP2 refuses it)."""
    order = [*reversed(wrapped), root]  # wrapped come in pre-order: reversed, children first
    names = {id(p): n for n, p in root.named_parameters()}
    unit_of = {}  # id(submodule) -> index of the innermost unit around it
    for i, m in enumerate(order):
        for sub in m.modules():
            unit_of.setdefault(id(sub), i)
    users: dict[int, set[int]] = {}  # id(param) -> units where it is registered
    for sub in root.modules():
        for p in sub._parameters.values():
            if p is not None and p.requires_grad:
                users.setdefault(id(p), set()).add(unit_of[id(sub)])
    owner = {pid: _common_unit(order, sorted(us)) for pid, us in users.items()}
    units = []
    for i, m in enumerate(order):
        params = {names[id(p)]: p for p in m.parameters() if owner.get(id(p)) == i}
        if params:
            units.append(FlatParamUnit(len(units), m, params, group, param_dtype))
    return units


def _common_unit(order: list[nn.Module], holders: list[int]) -> int:
    """Index of the innermost unit of `order` (children first) containing every holder."""
    if len(holders) == 1:
        return holders[0]
    return next(i for i, m in enumerate(order) if all(_contains(m, order[h]) for h in holders))


def _contains(outer: nn.Module, inner: nn.Module) -> bool:
    return any(m is inner for m in outer.modules())
