"""What dp_shard shards in the composed grid: ZeRO-1, ZeRO-2 or ZeRO-3 (FSDP), per layer.

The modes are Megatron-core's `DistributedDataParallelConfig.data_parallel_sharding_strategy`
(Megatron-FSDP): `optim` (ZeRO-1: lesson 10's `ZeroRedundancyOptimizer` over the whole
chunk, `parallelize`'s default), `optim_grads` (ZeRO-2) and `optim_grads_params` (ZeRO-3,
FSDP: Rajbhandari et al. 2020 section 5; Zhao et al. 2023 "PyTorch FSDP" section 3). In the
last two every layer of every chunk is a unit (`ShardedUnit`, torchtitan's `fully_shard` per
transformer block), its dense parameters (this rank's tp shards, as steps 1-5 left them)
flat-sharded over dp_shard × cp (torchtitan's `dp_shard_cp`), its experts over `ep_shard`
(the ranks holding the same experts: torchtitan's EP-aware FSDP); the rest of a chunk
(embeddings, final norm, head: the root, as lesson 03's) is one unit per group, kept whole
through the step.

- A unit's gradients are reduce-scattered (float32, the mean over its group) into the
  rank's chunk, added up over micro-batches, as soon as autograd has accumulated every one
  of them (`register_post_accumulate_grad_hook`): in the backward, or in the W step of a
  zero-bubble schedule; the full gradients are then freed. The root's wait for the step's
  end (the tied embedding's copies are summed first); so does whatever a unit did not
  complete (an expert no token reached).
- `optim_grads_params`: a layer's parameters live only as the float32 chunk; all-gathered (in
  the compute dtype) before its forward, freed after it (`reshard_after_forward`, torchtitan's
  name; else kept until its backward), gathered again when its output's gradient arrives,
  freed once its gradients are reduced and no W step still needs them. Freeing keeps the
  tensors (`untyped_storage().resize_(0)`, lesson 03's `FlatParamUnit`): what autograd saved
  sees the values again after the next gather into the same storage.
- HSDP: the reduced chunks are all-reduced over dp_replicate at the step's end (Zhao et al.
  section 3.2.2), then Adam/AdamW steps each chunk (`optim.py`'s `ShardAdam`).

- Prefetch (lesson 03's, PyTorch FSDP's forward and backward prefetch): as a layer starts,
  the gather of the one that runs next in its chunk (after it in forward, before it in
  backward) is started, so it runs while this layer computes; at most one in flight.

- CPU offload (`offload()`, lesson 05): each unit's float32 chunk, its reduced gradient and
  Adam's state live in host memory; a gather copies the chunk up (cast first), a reduce
  copies the gradient chunk down (FSDP2's `CPUOffloadPolicy`).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .. import comm
from ..expert_parallel.gpt import is_expert
from ..parallel import all_reduce_flat
from ..zero.optimizer import ZeroRedundancyOptimizer
from .tensor_parallel import sum_partial_gradients

MODES = ("optim", "optim_grads", "optim_grads_params")


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"--dp-shard-mode={mode!r} must be one of {MODES}")
    return mode


class ShardedUnit(ZeroRedundancyOptimizer):
    """One unit's parameters flat-sharded over `group`: its float32 chunk, Adam on it, its
    gradients reduced into `shard.grad` (÷ `divide`) and, if `sharded`, its parameters
    gathered only while a forward or backward needs them."""

    def __init__(self, params, group, divide: int, sharded: bool, index: int, tp_group=None):
        super().__init__(params, torch.optim.Adam, group=group)
        self.divide, self.sharded, self.index = divide, sharded, index
        self.tp_group = tp_group  # where partial gradients are summed (None: tp = 1)
        self.gathered, self.in_flight = True, None
        self.pending = 0  # backwards begun whose gradients are not all reduced yet (W)
        self.accumulated: set[int] = set()

    @torch.no_grad()
    def reduce_gradients(self) -> None:
        """The gradients autograd left (a missing one is zero), their mean over the group
        added into this rank's chunk; the full ones freed."""
        if all(p.grad is None for p in self.params):
            return
        if self.tp_group is not None:  # over tp first: these are this micro-batch's
            sum_partial_gradients(self.params, self.tp_group)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = self.layout.flatten([g.float() for g in grads]).div_(self.world * self.divide)
        chunk = flat.new_empty(self.layout.chunk)
        comm.reduce_scatter(chunk, flat, group=self.group, tag=f"zero2-grads-unit{self.index}")
        chunk = self.to_host(chunk)  # offloaded: the chunk accumulates on the host
        self.shard.grad = chunk if self.shard.grad is None else self.shard.grad.add_(chunk)
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def unshard(self, async_op: bool = False) -> None:
        """Gather the parameters (in the compute dtype: the cast before the gather); with
        `async_op`, only start it (a prefetch: the unit's own use waits)."""
        if self.gathered or self.in_flight is not None:
            if not async_op:
                self.wait()
            return
        dtype = self.params[0].dtype
        full = self.shard.new_empty(self.layout.padded, dtype=dtype, device=self.device)
        work = comm.all_gather(
            full,
            self.to_device(self.shard.detach(), dtype),  # cast before the gather
            group=self.group,
            async_op=True,
            tag=f"fsdp-params{self.index}",
        )
        self.in_flight = (work, full)
        if not async_op:
            self.wait()

    @torch.no_grad()
    def wait(self) -> None:
        if self.in_flight is None:
            return
        work, full = self.in_flight
        work.wait()
        self.in_flight = None
        for p, view in zip(self.params, self.layout.views(full)):
            p.data.untyped_storage().resize_(p.numel() * p.element_size())
            p.data.copy_(view)  # `.data`: no version bump, what autograd saved stays valid
        self.gathered = True

    def reshard(self) -> None:
        if self.sharded and self.gathered and not self.pending:
            for p in self.params:
                p.data.untyped_storage().resize_(0)
            self.gathered = False

    @torch.no_grad()
    def gather(self) -> None:
        """After the update or a load: every replica's parameters from the chunks (ZeRO-2),
        or, sharded, the stale full parameters freed (the next forward gathers)."""
        if not self.sharded:
            super().gather()
            return
        self.wait()
        self.pending, self.gathered = 0, True
        self.reshard()

    def done(self, p: torch.Tensor) -> None:
        """A parameter's gradient accumulated: once all are, reduce them (and reshard)."""
        self.accumulated.add(id(p))
        if len(self.accumulated) == len(self.params):
            self.accumulated.clear()
            self.reduce_gradients()
            self.pending = max(0, self.pending - 1)
            self.reshard()

    def begin_backward(self) -> None:
        self.unshard()  # or wait for the prefetch
        self.accumulated.clear()
        self.pending += 1


class ShardedDataParallel:
    """The units of `engine`'s chunks under `mode` (`optim_grads` or `optim_grads_params`):
    per chunk, each layer's dense parameters over dp_shard × cp and its experts over
    ep_shard, then the chunk's rest (the root, never resharded within a step)."""

    def __init__(
        self, engine, mode: str, reshard_after_forward: bool = True, prefetch: bool = True
    ):
        self.engine, self.mode = engine, mode
        self.reshard_after_forward = reshard_after_forward
        named = engine._named()
        by_id = {id(p): n for n, p in named.items() if p.requires_grad}
        self.units: list[tuple[list[str], ShardedUnit]] = []
        self.layers: list[tuple[nn.Module, list, list, list]] = []  # units, next's, previous'
        for chunk in engine.chunks:
            seen: set[str] = set()
            mine = []  # (layer, its units) in the chunk's order
            for layer in chunk.layers():
                names = [by_id[id(p)] for p in layer.parameters() if id(p) in by_id]
                seen.update(names)
                mine.append((layer, self._add(named, names, layer=True)))
            for k, (layer, units) in enumerate(mine):  # whom each layer prefetches
                after = mine[k + 1][1] if prefetch and k + 1 < len(mine) else []
                before = mine[k - 1][1] if prefetch and k > 0 else []
                self.layers.append((layer, units, after, before))
            rest = [by_id[id(p)] for p in chunk.parameters() if id(p) in by_id]
            self._add(named, [n for n in rest if n not in seen], layer=False)

    def _add(self, named, names: list[str], layer: bool) -> list[ShardedUnit]:
        dims, grid, made = self.engine.dims, self.engine.grid, []
        experts = [n for n in names if dims.ep > 1 and is_expert(n)]
        dense = [n for n in names if n not in experts]
        for part, kind, divide in ((dense, "dp_shard_cp", 1), (experts, "ep_shard", dims.ep)):
            if part:
                sharded = layer and self.mode == "optim_grads_params"
                tp = grid.group("tp") if dims.tp > 1 else None
                params = [named[n] for n in part]
                unit = ShardedUnit(params, grid.group(kind), divide, sharded, len(self.units), tp)
                self.units.append((part, unit))
                made.append(unit)
        return made

    def install(self) -> None:
        """Hooks on every layer and parameter (after the parameters took their compute
        dtype); the sharded layers' parameters freed."""
        for layer, units, after, before in self.layers:
            for unit in units:  # the root's wait for the step's end
                for p in unit.params:
                    p.register_post_accumulate_grad_hook(unit.done)
            layer.register_forward_pre_hook(
                lambda *_, units=units, after=after: _start(units, after)
            )
            layer.register_forward_hook(self._after_forward(units, before))
        for _, unit in self.units:
            unit.reshard()

    def _after_forward(self, units: list[ShardedUnit], before: list[ShardedUnit]):
        def hook(module, args, output):
            out = _first_grad_tensor(output)
            if out is not None and torch.is_grad_enabled():
                # its gradient arrives just before the layer's backward (B, or W's)
                out.register_hook(lambda grad: _start(units, before, "begin_backward"))
            if self.reshard_after_forward or not torch.is_grad_enabled():
                _each(units, "reshard")

        return hook

    @torch.no_grad()
    def finish(self) -> None:
        """What the backward left reduced (the root, incomplete units), a zero chunk where
        nothing was, then HSDP's all-reduce of the chunks over dp_replicate."""
        dims = self.engine.dims
        self.grad_bytes = sum(  # on the device: full gradients not yet reduced
            p.grad.numel() * p.grad.element_size()
            for _, u in self.units
            for p in u.params
            if p.grad is not None
        )
        self.chunk_grad_bytes = sum(  # the reduced chunks (on the host when offloaded)
            u.shard.grad.numel() * 4 for _, u in self.units if u.shard.grad is not None
        )
        for _, unit in self.units:
            unit.reduce_gradients()
            unit.accumulated.clear()
            unit.pending = 0
            if unit.shard.grad is None:
                unit.shard.grad = torch.zeros_like(unit.shard)
        if dims.dp_replicate > 1:  # offloaded: up, all-reduced, down again
            chunks = [u.to_device(u.shard.grad) for _, u in self.units]
            all_reduce_flat(chunks, self.engine.grid.group("dp_replicate"), "hsdp-chunks")
            for (_, u), g in zip(self.units, chunks):
                u.shard.grad = u.to_host(g.div_(dims.dp_replicate))

    def zero_grad(self) -> None:
        for _, unit in self.units:
            unit.shard.grad = None
            unit.accumulated.clear()


def _start(units: list[ShardedUnit], prefetch: list[ShardedUnit], how: str = "unshard"):
    """`units` gathered (waited for), then the gathers of `prefetch` (the layer that runs
    next: after it in forward, before it in backward) started: one in flight at a time."""
    _each(units, how)
    for unit in prefetch:
        unit.unshard(async_op=True)


def _each(units: list[ShardedUnit], method: str) -> None:
    for unit in units:
        getattr(unit, method)()


def _first_grad_tensor(output):
    if isinstance(output, torch.Tensor):
        return output if output.requires_grad else None
    if isinstance(output, tuple | list):
        return next((t for t in map(_first_grad_tensor, output) if t is not None), None)
    return None
