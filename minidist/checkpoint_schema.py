"""The shape of every record a checkpoint holds, checked before a load uses any field of it.

Shared by every format (`minidist.fsdp.checkpoint`, `minidist.resilience.universal`,
`minidist.embedding.checkpoint`). A checksum proves that the bytes are the ones the
checksums file lists, not that the writer wrote them: whoever can write the folder can
rewrite both (a forged record, resealed). What keeps such a record from reaching a load as
a raw `KeyError`, `TypeError` or `AttributeError` deep in it (or a wrong value used before
a later check) is one check of each record against the shape its writer writes, here:

- DCP's `.metadata` (`check_metadata`, run by `checkpoint_safe.read_metadata`, which every
  load of the FSDP and universal formats reads through): each entry a tensor (a torch dtype,
  a shape and chunks of ints >= 0, the chunks a list) or an object, each stored item a file
  name and an int byte range;
- the universal format's record (`check_universal_record`): exactly the fields
  `universal.save` writes, each of its type (`layout` an object, `step` and `samples` ints
  >= 0, never a bool, a float, NaN or above 2^63 - 1, `rng_streams` names each stored as a
  1-D uint8 tensor);
- the FSDP format's layout record (`check_fsdp_layout`): its units, aliases and optimizer
  as `checkpoint_layout._layout` writes them, each named tensor stored with its shape;
- the embedding format's manifest and rank files (`check_embedding_manifest`,
  `check_embedding_state`).

A field the writer does not write is refused too: the format's name says which fields its
version holds, and a record with others was written by something else. Every refusal is a
`CheckpointError` naming the file and the field.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from .checkpoint_files import CheckpointError

MAX_INT = 2**63 - 1  # a count a checkpoint records: an int64 (every tensor size and offset is)


class _Missing:
    def __repr__(self) -> str:
        return "missing"


MISSING = _Missing()


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def refuse(where, field: str, value, what: str) -> CheckpointError:
    return CheckpointError(f"{where}: {field} = {_show(value)} is not {what}")


def is_count(value, low: int = 0) -> bool:
    """An int (never a bool) in [low, 2^63 - 1]."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= MAX_INT


def count(where, field: str, value, low: int = 0) -> int:
    if not is_count(value, low):
        raise refuse(where, field, value, f"an int in [{low}, 2^63 - 1]")
    return value


def counts(where, field: str, value, length: int | None = None) -> tuple[int, ...]:
    """A sequence (list, tuple, torch.Size) of counts, of `length` when given."""
    if not isinstance(value, (list, tuple)) or not all(is_count(v) for v in value):
        raise refuse(where, field, value, "a list of ints >= 0")
    if length is not None and len(value) != length:
        raise refuse(where, field, value, f"{length} ints")
    return tuple(value)


def keys(where, field: str, record, required: set, optional: set = frozenset()) -> dict:
    """`record` an object holding every `required` key and nothing beyond `optional`."""
    if not isinstance(record, dict):
        raise refuse(where, field, record, "an object")
    if missing := sorted(required - record.keys()):
        raise CheckpointError(f"{where}: {field} has no {missing}")
    if extra := sorted(set(record) - required - set(optional), key=str):
        raise CheckpointError(
            f"{where}: {field} holds {extra}, which this format never writes (a record "
            "written by something else)"
        )
    return record


def string(where, field: str, value) -> str:
    if not isinstance(value, str):
        raise refuse(where, field, value, "a string")
    return value


# -- DCP's .metadata ----------------------------------------------------------------------------
def check_metadata(meta, where: Path) -> None:
    """Raise unless DCP's metadata `meta` (read from `where`) is shaped as DCP writes it."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        MetadataIndex,
        StorageMeta,
        TensorProperties,
        TensorStorageMetadata,
    )

    missing = MISSING
    entries = getattr(meta, "state_dict_metadata", missing)
    if not isinstance(entries, dict):
        raise refuse(where, "state_dict_metadata", entries, "a dict of entries")
    for fqn, md in entries.items():
        string(where, "an entry's name", fqn)
        field = f"entry {fqn}"
        if isinstance(md, BytesStorageMetadata):
            continue
        if not isinstance(md, TensorStorageMetadata):
            raise refuse(where, field, md, "a tensor's or an object's metadata")
        props = getattr(md, "properties", missing)
        if not isinstance(props, TensorProperties):
            raise refuse(where, f"{field} properties", props, "TensorProperties")
        dtype = getattr(props, "dtype", missing)
        if not isinstance(dtype, torch.dtype):
            raise refuse(where, f"{field} dtype", dtype, "a torch dtype")
        shape = counts(where, f"{field} size", getattr(md, "size", missing))
        chunks = getattr(md, "chunks", missing)
        if not isinstance(chunks, list):
            raise refuse(where, f"{field} chunks", chunks, "a list of chunks")
        for i, c in enumerate(chunks):
            if not isinstance(c, ChunkStorageMetadata):
                raise refuse(where, f"{field} chunks[{i}]", c, "a chunk's metadata")
            for part in ("offsets", "sizes"):
                value = getattr(c, part, missing)
                counts(where, f"{field} chunks[{i}] {part}", value, len(shape))
    stored = getattr(meta, "storage_data", missing)
    if not isinstance(stored, dict):
        raise refuse(where, "storage_data", stored, "a dict of stored items")
    for index, info in stored.items():
        if not isinstance(index, MetadataIndex) or not isinstance(
            getattr(index, "fqn", missing), str
        ):
            raise refuse(where, "a stored item's index", index, "a MetadataIndex")
        field = f"stored item {index.fqn}"
        if index.fqn not in entries:
            raise CheckpointError(f"{where}: {field} is no entry of state_dict_metadata")
        if getattr(index, "offset", missing) is not None:
            counts(where, f"{field} offset", getattr(index, "offset", missing))
        if not isinstance(info, _StorageInfo):
            raise refuse(where, field, info, "a file's byte range (_StorageInfo)")
        string(where, f"{field} file", getattr(info, "relative_path", missing))
        count(where, f"{field} offset in its file", getattr(info, "offset", missing))
        count(where, f"{field} length", getattr(info, "length", missing))
    storage_meta = getattr(meta, "storage_meta", None)
    if storage_meta is not None and not isinstance(storage_meta, StorageMeta):
        raise refuse(where, "storage_meta", storage_meta, "None or StorageMeta")
    planner_data = getattr(meta, "planner_data", None)
    if planner_data is not None and not isinstance(planner_data, dict):
        raise refuse(where, "planner_data", planner_data, "None or a dict")


def tensor_entry(meta, where, fqn: str, dtype=None, dim: int | None = None):
    """The metadata of entry `fqn`, which must be a stored tensor (of `dtype`, `dim`)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    md = meta.state_dict_metadata.get(fqn)
    if not isinstance(md, TensorStorageMetadata):
        what = "missing" if md is None else f"a {type(md).__name__}"
        raise CheckpointError(f"{where}: entry {fqn} is {what}, not a stored tensor")
    if dtype is not None and md.properties.dtype != dtype:
        raise refuse(where, f"entry {fqn} dtype", md.properties.dtype, str(dtype))
    if dim is not None and len(md.size) != dim:
        raise refuse(where, f"entry {fqn} size", list(md.size), f"{dim}-D")
    return md


# -- the universal format's record --------------------------------------------------------------
SCALER_FIELDS = {"scale_value", "good_steps", "skipped_in_a_row"}


def check_universal_record(record, meta, where, fields: set, fmt: str) -> None:
    """Raise unless the universal format's `record` holds exactly `fields`, each as
    `universal.save` writes it (its random streams stored for rank 0 as 1-D uint8)."""
    keys(where, "the record", record, fields)
    if record["format"] != fmt:
        raise refuse(where, "format", record["format"], repr(fmt))
    if not isinstance(record["layout"], dict):
        raise refuse(where, "layout", record["layout"], "an object")
    count(where, "world", record["world"], low=1)
    count(where, "step", record["step"])
    count(where, "samples", record["samples"])
    scaler = record["scaler"]
    if scaler is not None:
        keys(where, "scaler", scaler, SCALER_FIELDS)
        value = scaler["scale_value"]
        if not (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and value > 0
        ):
            raise refuse(where, "scaler.scale_value", value, "a finite number > 0")
        count(where, "scaler.good_steps", scaler["good_steps"])
        count(where, "scaler.skipped_in_a_row", scaler["skipped_in_a_row"])
    streams = record["rng_streams"]
    if not (isinstance(streams, list) and all(isinstance(s, str) for s in streams)):
        raise refuse(where, "rng_streams", streams, "a list of stream names")
    if len(set(streams)) != len(streams):
        raise refuse(where, "rng_streams", streams, "distinct names")
    for name in streams:  # rank 0's: the record lists its streams
        tensor_entry(meta, where, f"rng.0.{name}", torch.uint8, 1)


# -- the FSDP format's layout record -------------------------------------------------------------
KINDS = ("sharded", "tensor", "object")


def check_fsdp_layout(layout, meta, where, fmt: str, unit_key) -> None:
    """Raise unless the FSDP format's layout record is as `checkpoint_layout._layout` writes
    it, and every tensor it names is stored with the shape it says."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    keys(where, "the layout record", layout, {"format", "units", "aliases", "optimizer"})
    if layout["format"] != fmt:
        raise refuse(where, "format", layout["format"], repr(fmt))
    units = layout["units"]
    if not isinstance(units, list):
        raise refuse(where, "units", units, "a list")
    numels, names = {}, set()
    for i, u in enumerate(units):
        field = f"units[{i}]"
        keys(where, field, u, {"key", "names", "shapes", "dtype"})
        if not (isinstance(u["names"], list) and all(isinstance(n, str) for n in u["names"])):
            raise refuse(where, f"{field}.names", u["names"], "a list of names")
        if not isinstance(u["shapes"], list) or len(u["shapes"]) != len(u["names"]):
            raise refuse(where, f"{field}.shapes", u["shapes"], "a shape per name")
        shapes = [counts(where, f"{field}.shapes", s) for s in u["shapes"]]
        if u["key"] != unit_key(u["names"]):
            raise refuse(where, f"{field}.key", u["key"], repr(unit_key(u["names"])))
        if u["key"] in numels:
            raise refuse(where, f"{field}.key", u["key"], "a unit named once")
        string(where, f"{field}.dtype", u["dtype"])
        numels[u["key"]] = n = sum(math.prod(s) for s in shapes)
        md = tensor_entry(meta, where, f"model.{u['key']}", dim=1)
        if list(md.size) != [n] or str(md.properties.dtype) != u["dtype"]:
            raise CheckpointError(
                f"{where}: entry model.{u['key']} is {list(md.size)} {md.properties.dtype}, "
                f"its layout record says [{n}] {u['dtype']}"
            )
        names.update(u["names"])
    aliases = layout["aliases"]
    if not isinstance(aliases, dict) or not all(
        isinstance(v, str) and v in names for v in aliases.values()
    ):
        raise refuse(where, "aliases", aliases, "{tied name: a unit's parameter name}")
    for name in meta.state_dict_metadata:
        if name.startswith("model.") and not name.startswith("model.flat["):
            tensor_entry(meta, where, name)
    opt = layout["optimizer"]
    if opt is None:
        return
    keys(where, "optimizer", opt, {"class", "groups", "state"})
    string(where, "optimizer.class", opt["class"])
    groups = opt["groups"]
    if not (
        isinstance(groups, list)
        and all(isinstance(g, list) and all(k in numels for k in g) for g in groups)
    ):
        raise refuse(where, "optimizer.groups", groups, "a list of lists of unit keys")
    state = opt["state"]
    if not isinstance(state, dict):
        raise refuse(where, "optimizer.state", state, "{unit key: {state name: kind}}")
    for key, kinds in state.items():
        if key not in numels or not isinstance(kinds, dict):
            raise refuse(where, f"optimizer.state[{key!r}]", kinds, "a unit's {name: kind}")
        for name, kind in kinds.items():
            fqn = f"optim.{key}.{name}"
            if kind not in KINDS:
                raise refuse(where, f"optimizer.state[{key!r}][{name!r}]", kind, f"one of {KINDS}")
            if kind == "object":
                if not isinstance(meta.state_dict_metadata.get(fqn), BytesStorageMetadata):
                    raise CheckpointError(f"{where}: entry {fqn} is not a stored object")
                continue
            md = tensor_entry(meta, where, fqn)
            if kind == "sharded" and list(md.size) != [numels[key]]:
                raise refuse(where, f"entry {fqn} size", list(md.size), f"[{numels[key]}]")


# -- the embedding format ------------------------------------------------------------------------
EMBEDDING_KINDS = ("single", "distributed", "localized")


def check_embedding_manifest(manifest, where, fmt: str, rank_name) -> None:
    """Raise unless the embedding format's manifest (its checksums record) is as
    `embedding.checkpoint._seal` writes it: a file per saved rank, each with its tensors."""
    fields = {"format", "dim", "mode", "files", "kind", "world", "placement"}
    keys(where, "the manifest", manifest, fields)
    if manifest["format"] != fmt:
        raise refuse(where, "format", manifest["format"], repr(fmt))
    count(where, "dim", manifest["dim"], low=1)
    string(where, "mode", manifest["mode"])
    if manifest["kind"] not in EMBEDDING_KINDS:
        raise refuse(where, "kind", manifest["kind"], f"one of {EMBEDDING_KINDS}")
    if manifest["placement"] is not None:
        string(where, "placement", manifest["placement"])
    world = count(where, "world", manifest["world"], low=1)
    if manifest["kind"] == "single" and world != 1:
        raise refuse(where, "world", world, "1 (a single layer's checkpoint)")
    files = manifest["files"]
    if not isinstance(files, dict):
        raise refuse(where, "files", files, "{file name: record}")
    names = {rank_name(r) for r in range(min(world, len(files) + 1))}  # world may be 2^62
    if set(files) != names or len(files) != world:
        raise refuse(where, "files", sorted(files), f"the {world} ranks' files")
    for name, rec in files.items():
        keys(where, f"files[{name!r}]", rec, {"bytes", "sha256", "tensors"})
        count(where, f"files[{name!r}].bytes", rec["bytes"])
        string(where, f"files[{name!r}].sha256", rec["sha256"])
        tensors = rec["tensors"]
        if not isinstance(tensors, dict) or not all(isinstance(v, str) for v in tensors.values()):
            raise refuse(where, f"files[{name!r}].tensors", tensors, "{tensor name: sha256}")


def check_embedding_state(state, where, manifest: dict) -> None:
    """Raise unless one rank's file holds what `embedding_state_dict` writes, of the
    manifest's dim and mode: int64 keys, a [keys, dim] table, optimizer rows shaped like it."""
    fields = {"keys", "vectors", "optimizer", "optimizer_other", "dim", "mode"}
    keys(where, "the state", state, fields)
    if state["dim"] != manifest["dim"] or state["mode"] != manifest["mode"]:
        raise CheckpointError(
            f"{where}: dim={_show(state['dim'])}, mode={_show(state['mode'])} are not the "
            f"manifest's dim={manifest['dim']}, mode={manifest['mode']!r}"
        )
    k, v = state["keys"], state["vectors"]
    if not (isinstance(k, torch.Tensor) and k.dtype == torch.int64 and k.dim() == 1):
        raise refuse(where, "keys", k, "a 1-D int64 tensor")
    rows = (k.numel(), manifest["dim"])
    if not (isinstance(v, torch.Tensor) and v.is_floating_point() and tuple(v.shape) == rows):
        raise refuse(where, "vectors", v, f"a floating {list(rows)} tensor")
    opt = state["optimizer"]
    if not isinstance(opt, dict) or not all(
        isinstance(t, torch.Tensor) and t.is_floating_point() and tuple(t.shape) == rows
        for t in opt.values()
    ):
        raise refuse(where, "optimizer", opt, f"{{name: a floating {list(rows)} tensor}}")
    if not isinstance(state["optimizer_other"], dict):
        raise refuse(where, "optimizer_other", state["optimizer_other"], "a dict")
