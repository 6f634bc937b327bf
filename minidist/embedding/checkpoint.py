"""Key-sorted save and load of hash embeddings and their sparse optimizers' state.

A hash embedding's rows are numbered in the order keys were first claimed, which depends on
the back end, the batch order and the placement; the portable form of the table is the map
key -> (vector, optimizer state). HugeCTR saves a sparse model that way (NVIDIA Merlin
HugeCTR docs, "Embedding Training Cache" and `Model::save_params_to_files`: a `key` file
and an `emb_vector` file per table, and the optimizer's per-key states beside them), and so
does this module:

- `embedding_state_dict(layer, optimizer)`: the keys sorted ascending, their vectors, and
  for every optimizer state shaped like the table (momentum, accumulator, moments) its rows
  in the same key order, plus the optimizer's other state (Adam's step count) as is;
- `load_embedding_state_dict(layer, optimizer, state)`: into a *fresh* layer (an empty
  table): the keys are inserted in key order, vectors and states written to their new rows.
  Training then continues exactly as it would have: every computation is per row and per
  occurrence in input order, so the row numbers do not enter the results (bitwise equal,
  tests/test_embedding_checkpoint.py).

`save(layer, optimizer, directory)` / `load(layer, optimizer, directory)` on files (every
rank of a distributed layer calls them):

- each rank writes its shard, `embedding_rank{r}.pt`, into `.<name>.unfinished` beside
  `directory` (write beside, fsync, rename); after a barrier rank 0 records the world, the
  placement and every file's and tensor's SHA-256 (`minidist.checksums.json`, written last)
  and swaps the directory into place (`minidist.checkpoint_files`): a save killed on any rank
  leaves the previous checkpoint whole and loadable;
- a load reshards: every rank reads the files that can hold its keys and keeps the keys it
  owns in *this* world (`key_owner` for distributed slots, everything for one
  `HashEmbeddingBag`), with their optimizer rows, so a checkpoint of N ranks loads on any M.
  Localized slots (`LocalizedSlotSparseEmbeddingHash`) place by slot, which a key does not
  record: they reload on M ranks when M divides the saving world (or M = 1);
- a load reads tensors only (`torch.load(weights_only=True)`: no code from the file runs)
  and verifies each file's size and each tensor's checksum first, naming the file or tensor
  (`CheckpointError`), before anything changes.

Not done here: incremental dumps of the rows touched since the last save (HugeCTR's ETC),
torch.distributed.checkpoint.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from .. import comm
from ..checkpoint_files import (
    CHECKSUMS,
    CheckpointError,
    check_file,
    file_record,
    put_in_place,
    read_json,
    recover,
    sha256_tensor,
    unfinished_path,
    write_json,
)
from .distributed import (
    DistributedSlotSparseEmbeddingHash,
    LocalizedSlotSparseEmbeddingHash,
    key_owner,
)
from .layers import HashEmbeddingBag

FORMAT = "minidist-embedding-checkpoint/2"


def _local(layer) -> HashEmbeddingBag:
    """The HashEmbeddingBag that holds this rank's keys (the layer itself, or its shard)."""
    local = getattr(layer, "local", layer)
    if not isinstance(local, HashEmbeddingBag):
        raise TypeError(
            f"layer must be a HashEmbeddingBag or a slot embedding, got {type(layer).__name__}"
        )
    return local


def _table_states(optimizer, weight) -> tuple[dict, dict]:
    """(states shaped like the table, other states) of `weight` in `optimizer`."""
    if optimizer is None:
        return {}, {}
    state = optimizer.state.get(weight, {})
    rows = {k: v for k, v in state.items() if torch.is_tensor(v) and v.shape == weight.shape}
    other = {k: v for k, v in state.items() if k not in rows}
    return rows, other


def embedding_state_dict(layer, optimizer=None) -> dict:
    """{keys, vectors, optimizer: {name: rows in key order}, optimizer_other, dim, mode}."""
    local = _local(layer)
    keys, rows = local.table.items()
    table_states, other = _table_states(optimizer, local.weight)
    return dict(
        keys=keys.clone(), vectors=local.weight.detach()[rows].clone(),
        optimizer={name: t.detach()[rows].clone() for name, t in table_states.items()},
        optimizer_other={k: (v.clone() if torch.is_tensor(v) else v) for k, v in other.items()},
        dim=local.dim, mode=layer.mode,
    )  # fmt: skip


def load_embedding_state_dict(layer, optimizer, state: dict) -> None:
    """Load `state` (from `embedding_state_dict`) into a fresh layer and its optimizer."""
    who = "load_embedding_state_dict"
    local = _local(layer)
    if local.table.size:
        raise ValueError(
            f"{who}: layer already holds {local.table.size} keys; load into a fresh layer"
        )
    if state["dim"] != local.dim or state["mode"] != layer.mode:
        raise ValueError(
            f"{who}: state has dim={state['dim']}, mode={state['mode']!r}; the layer has "
            f"dim={local.dim}, mode={layer.mode!r}"
        )
    table_states, _ = _table_states(optimizer, local.weight)
    if set(state["optimizer"]) != set(table_states):
        raise ValueError(
            f"{who}: state holds optimizer states {sorted(state['optimizer'])}, the optimizer "
            f"has {sorted(table_states)}"
        )
    rows = local.table.insert(state["keys"])  # raises HashTableFullError before any change
    with torch.no_grad():
        local.weight[rows] = state["vectors"].to(local.weight.device)
        for name, saved in state["optimizer"].items():
            table_states[name][rows] = saved.to(local.weight.device)
    if optimizer is not None:
        optimizer.state[local.weight].update(state["optimizer_other"])


def rank_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"embedding_rank{rank}.pt"


def _placement(layer) -> dict:
    """How `layer` places keys: kind, this rank, the world, the key placement."""
    if isinstance(layer, (DistributedSlotSparseEmbeddingHash, LocalizedSlotSparseEmbeddingHash)):
        world, rank = dist.get_world_size(layer.group), dist.get_rank(layer.group)
        kind = "localized" if isinstance(layer, LocalizedSlotSparseEmbeddingHash) else "distributed"
        return dict(kind=kind, rank=rank, world=world, placement=getattr(layer, "placement", None))
    _local(layer)
    return dict(kind="single", rank=0, world=1, placement=None)


def _tensors(state: dict) -> dict[str, torch.Tensor]:
    named = {"keys": state["keys"], "vectors": state["vectors"]}
    named.update({f"optimizer.{k}": v for k, v in state["optimizer"].items()})
    return named


def _write(state: dict, path: Path) -> dict:
    """torch.save beside `path`, fsync, rename; the file's and each tensor's checksums."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    tensors = {name: sha256_tensor(t) for name, t in _tensors(state).items()}
    return {**file_record(path), "tensors": tensors}


def save(layer, optimizer, directory: str | Path) -> Path:
    """Write the layer's keys (every rank its shard) as a complete checkpoint `directory`.

    Every rank of a distributed layer calls it. The previous checkpoint at `directory` stays
    whole until the new one is complete; an existing directory that is neither empty nor a
    checkpoint is refused.
    """
    directory, where = Path(directory), _placement(layer)
    if directory.exists() and any(directory.iterdir()) and not (directory / CHECKSUMS).is_file():
        raise FileExistsError(
            f"save: {directory} exists and is not an embedding checkpoint (no {CHECKSUMS}): "
            "refusing to replace it"
        )
    group = getattr(layer, "group", None) if where["kind"] != "single" else None
    unfinished, rank = unfinished_path(directory), where["rank"]
    if rank == 0:
        recover(directory)
        shutil.rmtree(unfinished, ignore_errors=True)  # what an interrupted save left
        unfinished.mkdir(parents=True)
    if where["kind"] != "single":
        comm.barrier(group, tag="checkpoint")
    record = _write(embedding_state_dict(layer, optimizer), rank_path(unfinished, rank))
    write_json(unfinished / f".rank{rank}.json", record)
    if where["kind"] != "single":
        comm.barrier(group, tag="checkpoint")  # every rank's file is complete
    if rank == 0:
        files = {}
        for r in range(where["world"]):
            files[rank_path(unfinished, r).name] = read_json(unfinished / f".rank{r}.json")
            (unfinished / f".rank{r}.json").unlink()
        local = _local(layer)
        manifest = dict(format=FORMAT, dim=local.dim, mode=layer.mode, files=files, **where)
        manifest.pop("rank")
        write_json(unfinished / CHECKSUMS, manifest)  # written last: the save is complete
        put_in_place(unfinished, directory)
    if where["kind"] != "single":  # nobody returns before the checkpoint is in place
        comm.barrier(group, tag="checkpoint")
    return rank_path(directory, rank)


def _read_rank(directory: Path, name: str, record: dict) -> dict:
    """One rank's file, verified: size, then each tensor's checksum, then the whole file's."""
    check_file(directory, name, {"bytes": record["bytes"]})
    path = directory / name
    try:
        state = torch.load(path, weights_only=True)
        tensors = _tensors(state)
    except Exception as e:  # a damaged file: pickle and zip raise many kinds
        raise CheckpointError(f"{path} cannot be read as an embedding state ({e!r})") from e
    for tensor_name, sha in record["tensors"].items():
        if tensor_name not in tensors or sha256_tensor(tensors[tensor_name]) != sha:
            raise CheckpointError(
                f"{path}: tensor {tensor_name} differs from the checksum recorded at save"
            )
    check_file(directory, name, record)
    return state


def _sources(manifest: dict, where: dict, who: str) -> list[int]:
    """The saved ranks whose files can hold this rank's keys."""
    if where["kind"] != "localized" or where["world"] == 1:
        return list(range(manifest["world"]))
    if manifest["kind"] == "localized" and manifest["world"] % where["world"] == 0:
        return [r for r in range(manifest["world"]) if r % where["world"] == where["rank"]]
    raise CheckpointError(
        f"{who}: a localized-slot layer on {where['world']} ranks places keys by slot, which a "
        f"key does not record; this checkpoint ({manifest['kind']} on {manifest['world']} "
        "ranks) loads into it only on a world that divides its own, or on one rank"
    )


def _merge(states: list[dict], mine, who: str) -> dict:
    """The saved shards' keys that this rank owns, in key order, with their rows."""
    parts = []
    for state in states:
        keep = mine(state["keys"])
        parts.append({name: t[keep] for name, t in _tensors(state).items()})
    merged = {name: torch.cat([p[name] for p in parts]) for name in parts[0]}
    order = torch.argsort(merged["keys"])
    merged = {name: t[order] for name, t in merged.items()}
    keys = merged["keys"]
    if keys.numel() > 1 and bool((keys[1:] == keys[:-1]).any()):
        dup = int(keys[1:][keys[1:] == keys[:-1]][0])
        raise CheckpointError(f"{who}: key {dup} is in more than one rank's file")
    others = [s["optimizer_other"] for s in states]
    for other in others[1:]:
        if other.keys() != others[0].keys() or any(
            not torch.equal(torch.as_tensor(other[k]), torch.as_tensor(others[0][k])) for k in other
        ):
            raise CheckpointError(
                f"{who}: the ranks saved different optimizer counters ({others[0]} vs {other})"
            )
    return dict(
        keys=merged["keys"], vectors=merged["vectors"],
        optimizer={k[len("optimizer.") :]: v for k, v in merged.items() if k.startswith("opt")},
        optimizer_other=others[0], dim=states[0]["dim"], mode=states[0]["mode"],
    )  # fmt: skip


def load(layer, optimizer, directory: str | Path) -> None:
    """Load a checkpoint written by `save` on any world into a fresh layer on this world."""
    who, directory, where = "load", Path(directory), _placement(layer)
    recover(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{who}: no embedding checkpoint at {directory}")
    if not (directory / CHECKSUMS).is_file():
        raise CheckpointError(
            f"{who}: {directory} is not a complete embedding checkpoint (no {CHECKSUMS})"
        )
    manifest = read_json(directory / CHECKSUMS)
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{who}: {directory}: unknown format {manifest.get('format')!r}")
    states = [
        _read_rank(
            directory, rank_path(directory, r).name, manifest["files"][rank_path(directory, r).name]
        )
        for r in _sources(manifest, where, who)
    ]
    if where["kind"] == "distributed":
        world, rank, placement = where["world"], where["rank"], where["placement"]

        def mine(keys):
            return key_owner(keys, world, placement) == rank
    else:

        def mine(keys):
            return torch.ones_like(keys, dtype=torch.bool)

    load_embedding_state_dict(layer, optimizer, _merge(states, mine, who))
