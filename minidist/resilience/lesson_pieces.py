"""The pieces each earlier lesson's wrapper holds, so that lesson 18 checkpoints them all.

Lesson 17's composed engine hands its own `state_pieces()`; these adapters give the same for
the single-technique wrappers, so a checkpoint saved under one (ZeRO-1 on 4 ranks) loads
under another (FSDP on 2, one process):

- `flat_pieces`: ZeRO's buckets and FSDP's units are one flat, padded buffer of several
  parameters (`minidist.zero.FlatShard`); rank r's chunk [r·c, (r+1)·c) meets each
  parameter in a flat range of that parameter's elements, or not at all;
- `tensor_parallel_pieces`: a `tp_split = (dim, blocks, full)` parameter is, per block
  (Q, K, V), one box of the dense tensor (the vocabulary padding cut off);
- `module_pieces`: a plain module in one process: every tensor whole.

Optimizer state shaped like a parameter's local tensor (Adam's `exp_avg`, `exp_avg_sq`)
gets the parameter's pieces under `optim.<name>.<state>`; a scalar one (`step`) is whole
on every rank, saved by the first. Frozen parameters and buffers are whole everywhere.
A fresh optimizer has no state yet: `materialize_optimizer_state` makes it (one step with
lr 0 on zero gradients, as `torch.distributed.checkpoint.state_dict` does) before a load.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from ..pieces import Piece


def _optim_pieces(piece: Piece, local: torch.Tensor, states: dict, first: bool) -> list[Piece]:
    """`piece`'s twins for each optimizer state of the tensor `local` it is a part of."""
    out = []
    for key, value in states.items():
        if not isinstance(value, torch.Tensor):
            continue
        name = f"optim.{piece.name}.{key}"
        if value.shape == local.shape and value.dim() > 0:
            part = _same_part(piece, local, value)
            out.append(
                Piece(
                    name,
                    piece.global_shape,
                    piece.box_offsets,
                    piece.box_sizes,
                    piece.flat,
                    part,
                    piece.owner,
                )
            )
        elif value.dim() == 0:
            out.append(Piece(name, (), (), (), None, value, first))
    return out


def _same_part(piece: Piece, local: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """The part of `value` that `piece.tensor` is of `local` (same offset, size, strides)."""
    offset = piece.tensor.storage_offset() - local.storage_offset()
    return value.as_strided(
        piece.tensor.shape, piece.tensor.stride(), value.storage_offset() + offset
    )


def _whole(name: str, t: torch.Tensor, owner: bool) -> Piece:
    shape = tuple(t.shape)
    return Piece(name, shape, (0,) * len(shape), shape, None, t.detach(), owner)


def flat_pieces(units, optimizer=None, owner: bool = True) -> list[Piece]:
    """Pieces of flat units (`.names`, `.layout` a FlatShard, `.shard` this rank's padded
    chunk): ZeRO's `buckets`, FSDP's `units`. `owner`: this rank saves its chunks (False on
    all but one replica of hybrid sharding)."""
    pieces = []
    for u in units:
        lay, states = u.layout, (optimizer.state.get(u.shard, {}) if optimizer else {})
        for name, shape, offset, n in zip(u.names, lay.shapes, lay.offsets, lay.numels):
            lo, hi = max(offset, lay.start), min(offset + n, lay.start + lay.chunk)
            shape = tuple(shape)
            if lo < hi:
                p = Piece(
                    name,
                    shape,
                    (0,) * len(shape),
                    shape,
                    (lo - offset, hi - offset),
                    u.shard.detach()[lo - lay.start : hi - lay.start],
                    owner,
                )
                pieces += [p, *_optim_pieces(p, u.shard, states, lay.rank == 0 and owner)]
            else:  # scalar states (step) on every rank, also one without elements here
                empty = Piece(name, shape, (0,) * len(shape), shape, (0, 0), u.shard[:0], owner)
                first = lay.rank == 0 and owner
                pieces += [
                    q for q in _optim_pieces(empty, u.shard, states, first) if q.global_shape == ()
                ]
    return pieces


def replicated_pieces(module: nn.Module, skip: set[str], owner: bool) -> list[Piece]:
    """Frozen parameters and buffers (whole on every rank) not named in `skip`."""
    named = [*module.named_parameters(), *module.named_buffers()]
    return [_whole(n, t, owner) for n, t in named if n not in skip and not t.requires_grad]


def zero_pieces(zero) -> list[Piece]:
    """A `ZeroDataParallel` (stage 1 or 2) and its sharded optimizer."""
    owner = dist.get_rank(zero.group) == 0
    names = {n for b in zero.buckets for n in b.names}
    return flat_pieces(zero.buckets, zero.optimizer) + replicated_pieces(zero.module, names, owner)


def fsdp_pieces(fsdp, optimizer=None) -> list[Piece]:
    """A `FullyShardedDataParallel` and the optimizer built on its `sharded_parameters()`."""
    replica = fsdp.replicate_group
    owner = replica is None or dist.get_rank(replica) == 0
    names = {n for u in fsdp.units for n in u.names}
    first = owner and dist.get_rank(fsdp.shard_group) == 0
    return flat_pieces(fsdp.units, optimizer, owner) + replicated_pieces(fsdp.module, names, first)


def tensor_parallel_pieces(model: nn.Module, optimizer=None, group=None) -> list[Piece]:
    """A tensor-parallel model (parameters carrying `tp_split`) and a plain optimizer on it;
    replicated parameters are saved by tp rank 0 of `group`."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    pieces = []
    for name, p in model.named_parameters():
        states = optimizer.state.get(p, {}) if optimizer is not None else {}
        split = getattr(p, "tp_split", None)
        if split is None:
            parts = [_whole(name, p, r == 0)]
        else:
            dim, blocks, full = split
            per = p.shape[dim] // blocks  # this rank's rows of each block
            shape = list(p.shape)
            shape[dim] = full
            parts = []
            for b in range(blocks):
                start = b * per * n + r * per  # in the dense (padded) tensor
                size = max(0, min(per, full - start))
                offsets, sizes = [0] * p.dim(), list(p.shape)
                offsets[dim], sizes[dim] = start, size
                if size:
                    view = p.detach().narrow(dim, b * per, size)
                    parts.append(
                        Piece(name, tuple(shape), tuple(offsets), tuple(sizes), None, view)
                    )
        for part in parts:
            pieces += [part, *_optim_pieces(part, p.detach(), states, r == 0)]
    skip = {n for n, _ in model.named_parameters()}
    return pieces + [q for q in replicated_pieces(model, skip, r == 0)]


def module_pieces(model: nn.Module, optimizer=None) -> list[Piece]:
    """A plain module in one process (every tensor whole, this process the owner)."""
    pieces = []
    for name, p in model.named_parameters():
        whole = _whole(name, p, True)
        states = optimizer.state.get(p, {}) if optimizer is not None else {}
        pieces += [whole, *_optim_pieces(whole, p.detach(), states, True)]
    return pieces + [_whole(n, b, True) for n, b in model.named_buffers()]


@torch.no_grad()
def materialize_optimizer_state(optimizer) -> None:
    """Give a fresh optimizer its state tensors (one step at lr 0 on zero gradients, frozen
    parameters left without), so a load has somewhere to put it; an optimizer that already
    has state is left alone."""
    inner = getattr(optimizer, "inner", optimizer)
    if any(inner.state.values()):
        return
    lrs = [g["lr"] for g in inner.param_groups]
    params = [p for g in inner.param_groups for p in g["params"] if p.requires_grad]
    grads = [p.grad for p in params]
    for g in inner.param_groups:
        g["lr"] = 0.0
    for p in params:
        p.grad = torch.zeros_like(p)
    inner.step()
    for g, lr in zip(inner.param_groups, lrs):
        g["lr"] = lr
    for p, grad in zip(params, grads):
        p.grad = grad
