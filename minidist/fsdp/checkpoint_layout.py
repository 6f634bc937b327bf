"""What a sharded checkpoint of a flat-parameter wrapper holds: its keys and layout record.

The layout part of `minidist.fsdp.checkpoint` (which writes and reads with DCP; the checks
before a load are `checkpoint_check.py`'s, reading one whole in one process
`checkpoint_full.py`'s). Zhao et al. 2023, "PyTorch FSDP" (VLDB), on sharded state dicts: a
rank saves only its shard and a load on another number of ranks reshards, so the checkpoint
records global shapes and names.

**What is saved.** For `FullyShardedDataParallel` (its `units`) and `ZeroDataParallel`
stages 1-2 (its `buckets`), each flat unit of trainable parameters is one 1-D tensor,
stored as a DTensor over the shard group with placement `Shard(0)`:

- its global shape is the *unpadded* flat length L; its local tensor is the valid part of
  this rank's chunk. The flat layout (`FlatShard`: chunk c = ceil(L/N), rank r owns
  [r·c, (r+1)·c)) is exactly `torch.chunk`'s uneven `Shard(0)`: the last ranks hold a
  shorter or an empty piece; the padding is never written;
- the optimizer state of that unit (Adam's `exp_avg`, `exp_avg_sq`, any state tensor shaped
  like the chunk) is stored the same way; scalar state (`step`) as a replicated tensor;
  every param group's hyperparameters as objects;
- frozen parameters and buffers, which every rank holds whole, as replicated tensors (DCP
  writes each once);
- `minidist.layout`, a JSON record: each unit's parameter names, shapes and dtype, the tied
  names (`lm_head.weight` is `tok_emb.weight`) and the optimizer's class and groups.

Keys name parameters, never ranks or padding: `model.flat[layers.0.weight,layers.0.bias]`,
`optim.flat[...].exp_avg`, `optim.param_groups.0.lr`, `model.<frozen or buffer name>`. So a
checkpoint written on 4 ranks loads on 2, on 3, or in one process. With hybrid sharding the
DTensor lives on a 2-D mesh (`Replicate()` across the replica groups, `Shard(0)` within
one); DCP writes each chunk once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from ..checkpoint_files import REPLACED, UNFINISHED  # noqa: F401 (re-exported)
from ..zero.sharded import ZeroDataParallel
from .fully_sharded import FullyShardedDataParallel

FORMAT = "minidist-flat-checkpoint/2"
LAYOUT_KEY = "minidist.layout"


# -- what a wrapper holds --------------------------------------------------------------------
@dataclass
class _Sharded:
    """The flat units of a FullyShardedDataParallel or ZeroDataParallel, and where they live."""

    units: list  # objects with .names, .layout (FlatShard), .shard (this rank's padded chunk)
    module: nn.Module  # the single-process model (its names are the checkpoint's)
    group: object  # the process group the wrapper spans (None: the world)
    mesh: DeviceMesh
    placements: tuple
    aliases: dict[str, str]  # tied name -> the unit's name for the same parameter
    replicated: dict[str, torch.Tensor]  # frozen parameters and buffers, whole on every rank
    after_load: object  # called once the chunks hold the loaded values

    def is_rank0(self) -> bool:
        return dist.get_rank(self.group) == 0


def _sharded(model) -> _Sharded:
    if isinstance(model, FullyShardedDataParallel):
        units, group = model.units, None
        if model.replicate_group is None:  # one shard group: the world
            mesh = DeviceMesh.from_group(model.shard_group or dist.group.WORLD, _device(units))
            placements = (Shard(0),)
        else:  # hybrid: rows are shard groups, columns replica groups
            f = dist.get_world_size(model.shard_group)
            mesh = DeviceMesh.from_group(
                [model.replicate_group, model.shard_group],
                _device(units),
                mesh=torch.arange(model.world, device="cpu").view(model.world // f, f),
                mesh_dim_names=("replicate", "shard"),
            )
            placements = (Replicate(), Shard(0))
        paths = _module_paths(model.module)
        aliases = {
            full: u.names[i]
            for u in units
            for owner, attr, i in u.places
            for prefix in paths[id(owner)]
            if (full := prefix + attr) != u.names[i]
        }

        def after_load():
            for u in units:
                u.reshard()  # a unit still gathered would hold the old values

    elif isinstance(model, ZeroDataParallel):
        units, group = model.buckets, model.group
        mesh = DeviceMesh.from_group(group or dist.group.WORLD, _device(units))
        placements = (Shard(0),)
        canonical = {id(p): n for u in units for n, p in zip(u.names, u.params)}
        aliases = {
            n: canonical[id(p)]
            for n, p in model.module.named_parameters(remove_duplicate=False)
            if id(p) in canonical and canonical[id(p)] != n
        }
        after_load = model.gather_parameters
    else:
        raise TypeError(
            f"model must be a FullyShardedDataParallel or a ZeroDataParallel, got "
            f"{type(model).__name__} (a plain module: use torch.save / dcp.save directly)"
        )
    flat_names = {n for u in units for n in u.names} | set(aliases)
    replicated = {
        n: t for n, t in model.module.state_dict(keep_vars=True).items() if n not in flat_names
    }
    return _Sharded(units, model.module, group, mesh, placements, aliases, replicated, after_load)


def _device(units) -> str:
    return units[0].shard.device.type if units else "cpu"


def _module_paths(root: nn.Module) -> dict[int, list[str]]:
    """id(module) -> every prefix it is reachable under ("" for the root, "a.b." below)."""
    paths: dict[int, list[str]] = {}
    for name, m in root.named_modules(remove_duplicate=False):
        paths.setdefault(id(m), []).append(f"{name}." if name else "")
    return paths


def _unit_key(names: list[str]) -> str:
    """The checkpoint key of a flat unit: its parameter names, never a rank or a size."""
    return f"flat[{','.join(names)}]"


def _valid(layout) -> tuple[int, int]:
    """(offset, length) of this rank's non-padding elements: torch.chunk's uneven Shard(0)."""
    start = min(layout.start, layout.numel)
    return start, min(layout.numel, layout.start + layout.chunk) - start


def _dtensor(chunk: torch.Tensor, layout, s: _Sharded) -> DTensor:
    """This rank's padded chunk as a DTensor of the unpadded flat tensor (local: valid part)."""
    _, n = _valid(layout)
    return DTensor.from_local(
        chunk[:n],
        s.mesh,
        s.placements,
        run_check=False,
        shape=torch.Size([layout.numel]),
        stride=(1,),
    )


def _optimizer_units(optimizer, units) -> list[list]:
    """For each param group, its units in the group's order; every param must be a chunk."""
    by_id = {id(u.shard): u for u in units}
    groups = []
    for g, group in enumerate(optimizer.param_groups):
        for p in group["params"]:
            if id(p) not in by_id:
                raise ValueError(
                    f"optimizer.param_groups[{g}] holds a {tuple(p.shape)} tensor that is not "
                    "a unit's chunk: build the optimizer on fsdp.sharded_parameters() (FSDP) "
                    "or pass zero.optimizer (ZeRO)"
                )
        groups.append([by_id[id(p)] for p in group["params"]])
    return groups


def _state_kind(value, shard: torch.Tensor) -> str:
    """How an optimizer state entry is saved: sharded like the chunk (exp_avg, momentum), a
    replicated tensor (step) or an object."""
    if not isinstance(value, torch.Tensor):
        return "object"
    return "sharded" if value.shape == shard.shape else "tensor"


def _optimizer_class(optimizer) -> str:
    return type(getattr(optimizer, "inner", optimizer)).__name__


def _layout(s: _Sharded, optimizer) -> dict:
    record = {
        "format": FORMAT,
        "units": [
            {
                "key": _unit_key(u.names),
                "names": list(u.names),
                "shapes": [list(shape) for shape in u.layout.shapes],
                "dtype": str(u.shard.dtype),
            }
            for u in s.units
        ],
        "aliases": s.aliases,
        "optimizer": None,
    }
    if optimizer is not None:
        groups = _optimizer_units(optimizer, s.units)
        kinds = {}
        for u in s.units:
            for name, v in optimizer.state.get(u.shard, {}).items():
                kinds.setdefault(_unit_key(u.names), {})[name] = _state_kind(v, u.shard)
        record["optimizer"] = {
            "class": _optimizer_class(optimizer),
            "groups": [[_unit_key(u.names) for u in g] for g in groups],
            "state": kinds,  # unit key -> {state name: sharded | tensor | object}
        }
    return record
