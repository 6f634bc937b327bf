"""Key-sorted save and load of hash embeddings and their sparse optimizers' state.

The state dicts (`embedding_state_dict`, `load_embedding_state_dict`: the keys sorted, their
vectors and optimizer rows, after HugeCTR's `key`/`emb_vector` files, NVIDIA Merlin HugeCTR
docs, "Embedding Training Cache") are `state_dict.py`'s, importable from here too.

`save(layer, optimizer, directory)` / `load(layer, optimizer, directory)` on files (every
rank of a distributed layer calls them):

- each rank writes its shard, `embedding_rank{r}.pt`, into `.<name>.unfinished` beside
  `directory` (write beside, fsync, rename), a staging folder rank 0 holds locked for the
  save (another save to the same path is refused while it runs); after a barrier rank 0
  records the world, the placement and every file's and tensor's SHA-256
  (`minidist.checksums.json`, written last) and swaps the directory into place
  (`minidist.checkpoint_files`): a save killed on any rank leaves the previous checkpoint
  whole and loadable; a save that fails on rank 0 raises the same `CheckpointError` on every
  rank;
- a load reshards: every rank reads the files that can hold its keys and keeps the keys it
  owns in *this* world (`key_owner` for distributed slots, everything for one
  `HashEmbeddingBag`), with their optimizer rows, so a checkpoint of N ranks loads on any M.
  Localized slots (`LocalizedSlotSparseEmbeddingHash`) place by slot, which a key does not
  record: they reload on M ranks when M divides the saving world (or M = 1);
- a load reads tensors only (`torch.load(weights_only=True)`: no code from the file runs)
  and verifies each file's size, each tensor's checksum (no tensor the record lacks) and the
  whole file's first, naming the file or tensor (`CheckpointError`), before anything
  changes; it reads one version held open (`minidist.checkpoint_pin`), the same on every
  rank, so a save replacing the checkpoint meanwhile never mixes two versions.

Not done here: incremental dumps of the rows touched since the last save (HugeCTR's ETC),
torch.distributed.checkpoint.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import torch
import torch.distributed as dist

from ..checkpoint_files import (
    CHECKSUMS,
    CheckpointError,
    Staging,
    file_record,
    read_json,
    sha256_tensor,
    unfinished_path,
    write_json,
)
from ..checkpoint_pin import ATTEMPTS, Pinned, pin, raise_everywhere, same_everywhere
from ..checkpoint_schema import check_embedding_manifest, check_embedding_state
from .distributed import (
    DistributedSlotSparseEmbeddingHash,
    LocalizedSlotSparseEmbeddingHash,
    key_owner,
)
from .layers import HashEmbeddingBag  # noqa: F401 (the layer type a load accepts)
from .state_dict import (  # noqa: F401 (re-exported: the state dicts' home)
    _local,
    _merge,
    _tensors,
    embedding_state_dict,
    load_embedding_state_dict,
)

FORMAT = "minidist-embedding-checkpoint/2"


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
    group = getattr(layer, "group", None) if where["kind"] != "single" else False
    staging, error, rank = None, None, where["rank"]
    if rank == 0:  # claims the staging folder: refused while another save holds it
        try:
            staging = Staging(directory, "save")
        except (CheckpointError, OSError) as e:
            error = str(e)
    try:
        raise_everywhere(group, error)
        unfinished = unfinished_path(directory)
        try:
            record = _write(embedding_state_dict(layer, optimizer), rank_path(unfinished, rank))
            write_json(unfinished / f".rank{rank}.json", record)
        except Exception as e:  # every rank learns it: none waits for a file never written
            error = f"save: rank {rank} could not write its file ({type(e).__name__}: {e})"
        raise_everywhere(group, error)  # every rank's file is complete
        if staging is not None:
            try:
                _seal(staging, layer, where)
            except Exception as e:  # every rank gets the same error, none dies in gloo
                error = f"save: rank 0 could not complete {directory} ({type(e).__name__}: {e})"
        raise_everywhere(group, error)  # nobody returns before the checkpoint is in place
    finally:
        if staging is not None:
            staging.release()
    return rank_path(directory, rank)


def _seal(staging: Staging, layer, where: dict) -> None:
    """Rank 0: the manifest of every rank's file (written last), then the swap."""
    files = {}
    for r in range(where["world"]):
        files[rank_path(staging.folder, r).name] = read_json(staging.folder / f".rank{r}.json")
        (staging.folder / f".rank{r}.json").unlink()
    local = _local(layer)
    manifest = dict(format=FORMAT, dim=local.dim, mode=layer.mode, files=files, **where)
    manifest.pop("rank")
    write_json(staging.folder / CHECKSUMS, manifest)  # written last: the save is complete
    staging.put_in_place()


def _read_rank(pinned: Pinned, name: str) -> dict:
    """One rank's file of a pinned version, verified on the bytes held: its size, each
    tensor's checksum (naming the one that differs), no tensor unrecorded, the whole file's
    checksum. Parsing first is safe: tensors only (`weights_only=True`)."""
    record, path = pinned.record["files"][name], pinned.path / name
    pinned.check(name, {"bytes": record["bytes"]})
    data = pinned.read(name)
    try:
        state = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as e:  # a damaged file: pickle and zip raise many kinds
        raise CheckpointError(f"{path} cannot be read as an embedding state ({e!r})") from e
    check_embedding_state(state, path, pinned.record)  # as embedding_state_dict writes it
    tensors = _tensors(state)
    extra = sorted(set(tensors) - set(record["tensors"]))
    if extra:
        raise CheckpointError(f"{path}: tensors {extra} are not in the checkpoint's record")
    for tensor_name, sha in record["tensors"].items():
        if tensor_name not in tensors or sha256_tensor(tensors[tensor_name]) != sha:
            raise CheckpointError(
                f"{path}: tensor {tensor_name} differs from the checksum recorded at save"
            )
    if hashlib.sha256(data).hexdigest() != record["sha256"]:
        raise CheckpointError(f"{path}: its bytes differ from the checksum recorded at save")
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


def load(layer, optimizer, directory: str | Path) -> None:
    """Load a checkpoint written by `save` on any world into a fresh layer on this world.

    Every rank of a distributed layer calls it: all read the same version of the checkpoint
    even while a save replaces it (`minidist.checkpoint_pin`)."""
    who, directory, where = "load", Path(directory), _placement(layer)
    group = getattr(layer, "group", None) if where["kind"] != "single" else False
    for _ in range(ATTEMPTS):
        try:
            pinned = _pin(directory, who)
        except Exception as e:
            if group is False:
                raise
            same_everywhere(group, None, e)
        if group is False or same_everywhere(group, pinned.digest):
            break
        pinned.close()
    else:
        raise CheckpointError(f"{who}: the ranks kept reading different versions of {directory}")
    with pinned:
        manifest = pinned.record
        states = [
            _read_rank(pinned, rank_path(directory, r).name) for r in _sources(manifest, where, who)
        ]
    if where["kind"] == "distributed":
        world, rank, placement = where["world"], where["rank"], where["placement"]

        def mine(keys):
            return key_owner(keys, world, placement) == rank
    else:

        def mine(keys):
            return torch.ones_like(keys, dtype=torch.bool)

    load_embedding_state_dict(layer, optimizer, _merge(states, mine, who))


def _pin(directory: Path, who: str) -> Pinned:
    """A pinned version of an embedding checkpoint of this format."""
    try:
        pinned = pin(directory, who)
    except FileNotFoundError:
        raise FileNotFoundError(f"{who}: no embedding checkpoint at {directory}") from None
    except CheckpointError as e:
        if CHECKSUMS in str(e) and "not a complete" in str(e):
            raise CheckpointError(
                f"{who}: {directory} is not a complete embedding checkpoint (no {CHECKSUMS})"
            ) from None
        raise
    if pinned.record.get("format") != FORMAT:
        pinned.close()
        raise CheckpointError(f"{who}: {directory}: unknown format {pinned.record.get('format')!r}")
    try:  # every field's type, before any is used
        check_embedding_manifest(pinned.record, directory / CHECKSUMS, FORMAT, _rank_name)
    except CheckpointError:
        pinned.close()
        raise
    return pinned


def _rank_name(rank: int) -> str:
    return rank_path(".", rank).name
