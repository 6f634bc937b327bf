"""Sharded checkpoints of flat-parameter wrappers with `torch.distributed.checkpoint` (DCP).

PyTorch Distributed Checkpoint (https://pytorch.org/docs/stable/distributed.checkpoint.html):
every rank writes only what it holds, and a checkpoint records each tensor's *global* shape
and where every saved chunk sits in it, so that a world of another size (or one process)
reads back exactly the pieces it needs: resharding happens on load. Zhao et al. 2023,
"PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel" (VLDB), on model
checkpointing and state dicts: a full state dict gathers the whole model onto one rank
(`FullyShardedDataParallel.full_state_dict`), which stops scaling with the model; a sharded
one lets each rank save and load only its shard, and must then be resharded when the
number of ranks changes.

Split in five: this module writes and reads (`save`, `load`); `checkpoint_layout.py` holds
what a checkpoint records (keys, the layout record); `checkpoint_check.py` the checks before
a load; `checkpoint_safe.py` reading without running code, and the checksums;
`checkpoint_full.py` `load_full`. Every name is importable from here.

**What is saved** (`checkpoint_layout.py`): each flat unit of trainable parameters, and the
optimizer state shaped like it, as a 1-D DTensor (`Shard(0)`, or `(Replicate(), Shard(0))`
on hybrid sharding's 2-D mesh) of its unpadded length; scalar optimizer state, frozen
parameters and buffers as replicated tensors; a JSON record of the layout. Keys name
parameters, never ranks or padding, so a checkpoint written on 4 ranks loads on 2, on 3, or
in one process.

**API.** `save(path, model, optimizer)` and `load(path, model, optimizer)` on every rank;
`load_full(path)` in one process, no process group needed, returns the single-process
model's state dict (`model.load_state_dict(...)`) and the optimizer state keyed by parameter
names, the format of `torch.distributed.checkpoint.state_dict.get_optimizer_state_dict`
(load it with `set_optimizer_state_dict(model, optimizer, state)`).

- Loading reads this rank's piece of every flat tensor and pads it with zeros back to the
  chunk (in a running wrapper the padding is zero too: zero parameters, zero gradient, so
  zero Adam moments and zero update; an elementwise optimizer never lets it reach a valid
  element), then FSDP frees any gathered unit and ZeRO all-gathers its parameters.
- A checkpoint of another model is refused before anything changes: the layout and DCP's
  metadata are read first (`checkpoint_check.py`) and the error names the first parameter,
  unit, buffer or optimizer entry whose name or shape differs (`CheckpointMismatchError`).
- A save is written into `.<name>.unfinished` next to `path`, a staging folder group rank
  0 holds locked while the save runs (a second save to the same path, from another world,
  is refused with a `CheckpointError` on its every rank); after every rank finished (DCP's
  final collective, then a barrier) rank 0 records the checksums of every chunk
  (`minidist.checksums.json`, written last) and renames it to `path`, replacing an earlier
  checkpoint only then (`minidist.checkpoint_files`). An interrupted save leaves `path`
  absent or as it was, and `load` refuses the unfinished directory; one stopped between
  rank 0's two renames is finished by the next load or save (never while the save is alive
  and about to finish it). A leftover unfinished one is removed by the next save. A write
  that fails on any rank raises `RuntimeError` on every rank (DCP's `CheckpointException`
  is a `BaseException`, which `except Exception` would miss); a seal that fails on rank 0
  raises the same `CheckpointError` on every rank.
- A load reads one version whole while saves replace it (`minidist.checkpoint_pin`: the
  files held open through the directory they were in, the checks and the read on the same
  bytes), every rank of a group the same version.
- A checkpoint is data: a load never runs code from it (`checkpoint_safe.py`: `.metadata`
  through a restricted unpickler, other entries with `torch.load(weights_only=True)`), and
  verifies every chunk's checksum first; a missing, empty, truncated or altered file is a
  `CheckpointError` naming the file or tensor, before anything changes.

Not here: asynchronous saves (`dcp.async_save`), storage other than a file system every
rank sees, loading into another unit grouping (another `wrap` policy or bucket size, or
FSDP <-> ZeRO: go through `load_full`), optimizers whose state is not per parameter,
checkpoints of tensor or pipeline parallel models, data-loader or RNG state. DCP's own
collectives (plan exchange, metadata gather) go through `torch.distributed`, not
`minidist.comm`, so a ledger does not see them.
Native equivalent: `torch.distributed.checkpoint` with FSDP2's per-parameter DTensors and
`torch.distributed.checkpoint.state_dict.get_state_dict`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from .. import comm
from ..checkpoint_files import CHECKSUMS, CheckpointError, Staging, unfinished_path
from ..checkpoint_pin import ATTEMPTS, Pinned, raise_everywhere, same_everywhere
from .checkpoint_check import CheckpointMismatchError, _check, _read
from .checkpoint_full import _placeholder, load_full
from .checkpoint_layout import (
    FORMAT,
    LAYOUT_KEY,
    _dtensor,
    _layout,
    _Sharded,
    _sharded,
    _state_kind,
    _unit_key,
    _valid,
)
from .checkpoint_safe import dcp_load, seal

__all__ = ["save", "load", "load_full", "CheckpointMismatchError", "CheckpointError"]


# -- save --------------------------------------------------------------------------------------
def save(path: str | os.PathLike, model, optimizer=None) -> None:
    """Write a sharded checkpoint of `model` (and `optimizer`) to the directory `path`.

    Every rank of the wrapper's group calls it. `model`: a FullyShardedDataParallel or a
    ZeroDataParallel; `optimizer`: the torch optimizer built on `fsdp.sharded_parameters()`,
    or `zero.optimizer`. An existing checkpoint at `path` is replaced once the new one is
    complete; any other existing file or directory there is refused.
    """
    path = Path(path)
    s = _sharded(model)
    if path.exists() and not (path / CHECKSUMS).is_file():
        raise FileExistsError(
            f"save: {path} exists and is not a checkpoint (no {CHECKSUMS}): refusing to replace it"
        )
    state: dict[str, object] = {LAYOUT_KEY: json.dumps(_layout(s, optimizer))}
    for name, t in s.replicated.items():
        state[f"model.{name}"] = t.detach()
    for u in s.units:
        state[f"model.{_unit_key(u.names)}"] = _dtensor(u.shard.detach(), u.layout, s)
    if optimizer is not None:
        for u in s.units:
            for name, v in optimizer.state.get(u.shard, {}).items():
                sharded = _state_kind(v, u.shard) == "sharded"
                state[f"optim.{_unit_key(u.names)}.{name}"] = (
                    _dtensor(v.detach(), u.layout, s) if sharded else v
                )
        for g, group in enumerate(optimizer.param_groups):
            for name, v in group.items():
                if name != "params":
                    state[f"optim.param_groups.{g}.{name}"] = v
    staging, error = None, None
    if s.is_rank0():  # claims the staging folder: refused while another save holds it
        try:
            staging = Staging(path, "save")
        except (CheckpointError, OSError) as e:
            error = str(e)
    try:
        raise_everywhere(s.group, error)
        _write(state, path, s)
        error = seal(staging, FORMAT, path) or error
        raise_everywhere(s.group, error)  # nobody returns before `path` is in place
    finally:
        if staging is not None:
            staging.release()


def _write(state: dict, path: Path, s: _Sharded) -> None:
    """Every rank writes its files into the staging folder; returns once all have."""
    unfinished = unfinished_path(path)
    try:
        dcp.save(state, checkpoint_id=unfinished, process_group=s.group)
    except CheckpointException as e:  # every rank gets it (a BaseException: made ordinary)
        raise RuntimeError(
            f"save: writing failed on ranks {sorted(e.failures)}: {path} is unchanged; the "
            f"partial files are in {unfinished}"
        ) from e
    comm.barrier(s.group, tag="checkpoint")  # every rank's files are complete


# -- load ----------------------------------------------------------------------------------------
def load(path: str | os.PathLike, model, optimizer=None) -> None:
    """Load a checkpoint written by `save` (on a world of any size) into `model`/`optimizer`.

    Every rank of the wrapper's group calls it; each reads only its own chunks' elements.
    Raises `CheckpointMismatchError` (nothing changed) when the checkpoint is of another
    model or optimizer, `CheckpointError` when a file is missing, damaged or unsafe,
    `FileNotFoundError`/`ValueError` when `path` is no complete one.
    """
    path, s = Path(path), _sharded(model)
    for _ in range(ATTEMPTS):  # every rank the same version: a save may replace it meanwhile
        try:
            pinned, meta, layout = _read(path)
        except Exception as e:
            same_everywhere(s.group, None, e)
        if same_everywhere(s.group, pinned.digest):
            break
        pinned.close()
    else:
        raise CheckpointError(f"load: the ranks kept reading different versions of {path}")
    with pinned:
        _load(pinned, meta, layout, s, model, optimizer)


def _load(pinned: Pinned, meta, layout: dict, s: _Sharded, model, optimizer) -> None:
    _check(meta, layout, s, optimizer)
    dest: dict[str, object] = {f"model.{n}": torch.empty_like(t) for n, t in s.replicated.items()}
    for u in s.units:
        dest[f"model.{_unit_key(u.names)}"] = _dtensor(torch.empty_like(u.shard), u.layout, s)
    if optimizer is not None:
        kinds = layout["optimizer"]["state"]
        for u in s.units:
            key = _unit_key(u.names)
            for name, kind in kinds.get(key, {}).items():
                md = meta.state_dict_metadata[f"optim.{key}.{name}"]
                dest[f"optim.{key}.{name}"] = (
                    _dtensor(torch.empty_like(u.shard, dtype=md.properties.dtype), u.layout, s)
                    if kind == "sharded"
                    else _placeholder(md)
                )
        for k, md in meta.state_dict_metadata.items():
            if k.startswith("optim.param_groups."):
                dest[k] = _placeholder(md)
    dcp_load(dest, pinned, process_group=s.group)

    if optimizer is not None:  # first: its load_state_dict validates before it changes
        optimizer.load_state_dict(_torch_optimizer_state(optimizer, s, layout, dest))
    with torch.no_grad():
        for u in s.units:
            _, n = _valid(u.layout)
            u.shard[:n].copy_(dest[f"model.{_unit_key(u.names)}"].to_local())
            u.shard[n:].zero_()  # the padding
        for name, t in s.replicated.items():
            t.copy_(dest[f"model.{name}"])
    s.after_load()


def _padded(value, layout) -> torch.Tensor:
    """A DTensor's local piece back in a zero-padded chunk of this rank."""
    local = value.to_local()
    chunk = torch.zeros(layout.chunk, dtype=local.dtype, device=local.device)
    chunk[: local.numel()] = local
    return chunk


def _torch_optimizer_state(optimizer, s: _Sharded, layout: dict, loaded: dict) -> dict:
    """The loaded state as `optimizer.load_state_dict` wants it: by this world's indices."""
    current = optimizer.state_dict()
    index = {
        id(p): i
        for mine, theirs in zip(optimizer.param_groups, current["param_groups"])
        for p, i in zip(mine["params"], theirs["params"])
    }
    kinds = layout["optimizer"]["state"]
    state = {}
    for u in s.units:
        key = _unit_key(u.names)
        if key in kinds and id(u.shard) in index:
            state[index[id(u.shard)]] = {
                name: _padded(loaded[f"optim.{key}.{name}"], u.layout)
                if kind == "sharded"
                else loaded[f"optim.{key}.{name}"]
                for name, kind in kinds[key].items()
            }
    groups = []
    for g, group in enumerate(current["param_groups"]):
        prefix = f"optim.param_groups.{g}."
        saved = {k[len(prefix) :]: v for k, v in loaded.items() if k.startswith(prefix)}
        groups.append({**saved, "params": group["params"]})
    return {"state": state, "param_groups": groups}
