"""Reading a DCP checkpoint as data: no code from the file runs, every byte is verified first.

The safety part of `minidist.fsdp.checkpoint`. torch's `FileSystemReader` reads `.metadata`
with `pickle.load`, and `DefaultLoadPlanner` reads every non-tensor entry with
`torch.load` with `weights_only` off: a crafted checkpoint runs its payload in every loading
process (the Python docs, `pickle`: "never unpickle data that could have come from an
untrusted source"). Here:

- `.metadata` goes through a restricted unpickler that builds only DCP's metadata classes
  (`torch.distributed.checkpoint.metadata`, the file reader's `_StorageInfo`), `torch.Size`,
  dtypes and layouts, and paths; any other global is a `CheckpointError` naming it, raised
  before anything is called (the approach of the `pickle` docs' "Restricting Globals");
- non-tensor entries (the layout record, optimizer hyperparameters) are read with
  `torch.load(weights_only=True)`: strings, numbers, tuples, lists, dicts, tensors, nothing
  else; tensors were already read that way by DCP;
- `write_checksums` (rank 0, after every rank wrote its files) records `.metadata`'s SHA-256
  and, for every stored chunk, its file, byte range and SHA-256, keyed by the entry's name and
  offset; `verify` checks them all before a load reads one tensor, naming the file or the
  tensor that differs. Every loading rank verifies the whole checkpoint: one more read of it.
  It reads a *pinned* version (`minidist.checkpoint_pin`): the files held open, so that the
  bytes verified are the bytes loaded even while a save replaces the checkpoint;
- the metadata must describe what the files hold before anything is allocated from it: every
  tensor's chunks lie inside its shape, do not overlap and cover it exactly, each is stored
  in a listed file's byte range at least as long as its elements, and every stored item has
  a checksum (`cover`: a crafted `.metadata` claiming 2^34 elements is refused, not
  allocated); before that, every field of it has the type DCP writes
  (`minidist.checkpoint_schema.check_metadata`, run by `read_metadata`: a dtype that is no
  dtype, a size that is no list of ints, a byte range that is no int is a `CheckpointError`
  naming the field, never an `AttributeError` inside `cover`).
"""

from __future__ import annotations

import io
import math
import pickle
from pathlib import Path

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorStorageMetadata,
)

from ..checkpoint_files import CHECKSUMS, CheckpointError, file_record, sha256_file, write_json
from ..checkpoint_pin import Pinned
from ..checkpoint_schema import check_metadata

_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_ALLOWED = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}
MAX_CHUNKS = 4096  # per tensor: far above any world minidist runs, bounds the overlap check


def _allowed(module: str, name: str) -> bool:
    """DCP's metadata classes (defined in its module: not what it imports, like `os`), the
    few listed globals and torch's dtypes; never a dotted path (`Metadata.__init__...`)."""
    if "." in name:
        return False
    if (module, name) in _ALLOWED:
        return True
    if module == _METADATA_MODULE:
        import torch.distributed.checkpoint.metadata as md

        obj = getattr(md, name, None)
        return isinstance(obj, type) and obj.__module__ == _METADATA_MODULE
    return module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if not _allowed(module, name):
            raise CheckpointError(
                f".metadata refers to {module}.{name}, which a checkpoint's metadata never "
                "holds: refused unread (loading it could run code from the file)"
            )
        return super().find_class(module, name)


def _unpickle(raw: bytes, where: Path) -> Metadata:
    try:
        meta = _MetadataUnpickler(io.BytesIO(raw)).load()
    except CheckpointError as e:
        raise CheckpointError(f"{where.parent}/{e}") from None
    except Exception as e:  # truncated or garbled: pickle raises many kinds
        raise CheckpointError(f"{where} cannot be read ({e!r})") from e
    if not isinstance(meta, Metadata):
        raise CheckpointError(f"{where} holds a {type(meta).__name__}, not DCP's")
    check_metadata(meta, where)  # its fields' types, before anything reads one
    return meta


def read_metadata(path: Path | Pinned) -> Metadata:
    """DCP's metadata of the checkpoint at `path` (a directory, or a pinned version),
    unpickled with the restricted unpickler."""
    if isinstance(path, Pinned):
        return _unpickle(path.read(".metadata"), path.path / ".metadata")
    return _unpickle((path / ".metadata").read_bytes(), path / ".metadata")


class _PinnedFiles:
    """What `FileSystemReader` asks of its file system, answered from the held files."""

    def __init__(self, pinned: Pinned):
        self.pinned = pinned

    def concat_path(self, path, suffix: str) -> str:
        return suffix

    def create_stream(self, name: str, mode: str):
        return self.pinned.open(name)


class SafeReader(FileSystemReader):
    """DCP's file reader on a pinned version: `.metadata` read by the restricted unpickler,
    every file through the descriptor verified before."""

    def __init__(self, pinned: Pinned):
        super().__init__(pinned.path)
        self.fs = _PinnedFiles(pinned)
        self.pinned = pinned

    def read_metadata(self, *args, **kwargs) -> Metadata:
        meta = read_metadata(self.pinned)
        if getattr(meta, "storage_meta", None) is None:
            meta.storage_meta = StorageMeta()
        meta.storage_meta.load_id = self.load_id
        return meta


class SafePlanner(DefaultLoadPlanner):
    """DCP's load planner reading non-tensor entries with `torch.load(weights_only=True)`."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


# -- checksums -----------------------------------------------------------------------------------
def _entry_name(index) -> str:
    return index.fqn if index.offset is None else f"{index.fqn} (chunk at {list(index.offset)})"


def seal(staging, fmt: str, path) -> str | None:
    """Rank 0 of a save, after every rank's files are on disk: the checksums (written last:
    the save is complete), then the staging folder put in place; the error to raise on every
    rank, or None."""
    if staging is None:
        return None
    try:
        write_checksums(staging.folder, fmt)
        staging.put_in_place()
    except Exception as e:  # every rank gets the same error, none dies in gloo
        return f"save: rank 0 could not complete {path} ({type(e).__name__}: {e})"
    return None


def write_checksums(path: Path, fmt: str) -> None:
    """Record `.metadata`'s checksum and every stored chunk's (written last: it marks the
    checkpoint complete)."""
    meta = read_metadata(path)
    files = {".metadata": file_record(path / ".metadata")}
    entries = []
    for index, info in meta.storage_data.items():
        name = info.relative_path
        files.setdefault(name, {"bytes": (path / name).stat().st_size})
        entries.append(
            {
                "entry": _entry_name(index),
                "file": name,
                "start": info.offset,
                "length": info.length,
                "sha256": sha256_file(path / name, info.offset, info.length),
            }
        )
    write_json(path / CHECKSUMS, {"format": fmt, "files": files, "entries": entries})


def verify(pinned: Pinned) -> Metadata:
    """Check every file and chunk of a pinned version against the checksums and the metadata
    against the files (`cover`); return the (safely read) metadata."""
    record, path = pinned.record, pinned.path
    if ".metadata" not in record["files"]:
        raise CheckpointError(f"{path / CHECKSUMS} does not list .metadata")
    pinned.check(".metadata", record["files"][".metadata"])
    meta = read_metadata(pinned)
    for name, rec in record["files"].items():
        if name != ".metadata":
            pinned.check(name, rec)
    for e in record.get("entries", []):
        if pinned.sha256(e["file"], e["start"], e["length"]) != e["sha256"]:
            raise CheckpointError(
                f"{path / e['file']}: tensor {e.get('entry', e['file'])} differs from the "
                f"checksum recorded at save (bytes {e['start']}..{e['start'] + e['length']})"
            )
    cover(meta, record, path)
    return meta


def _refuse(path: Path, fqn: str, why: str) -> CheckpointError:
    return CheckpointError(f"{path / '.metadata'}: entry {fqn} {why}: refused before allocating")


def cover(meta: Metadata, record: dict, path: Path) -> None:
    """Raise unless the metadata describes exactly what the verified files hold (see the
    module): checked before a load allocates anything from it."""
    checked = {(e["file"], e["start"], e["length"]) for e in record.get("entries", [])}
    for index, info in meta.storage_data.items():
        size = record["files"].get(info.relative_path, {}).get("bytes")
        if size is None or not 0 <= info.offset <= info.offset + info.length <= size:
            raise _refuse(path, index.fqn, f"is stored outside the listed files ({info})")
        if (info.relative_path, info.offset, info.length) not in checked:
            raise _refuse(path, index.fqn, "is stored in bytes no checksum covers")
    for fqn, md in meta.state_dict_metadata.items():
        if isinstance(md, BytesStorageMetadata):
            if MetadataIndex(fqn) not in meta.storage_data:
                raise _refuse(path, fqn, "is stored nowhere")
            continue
        if not isinstance(md, TensorStorageMetadata):
            raise _refuse(path, fqn, f"is a {type(md).__name__}")
        _cover_tensor(meta, md, fqn, path)


def _cover_tensor(meta: Metadata, md: TensorStorageMetadata, fqn: str, path: Path) -> None:
    shape = list(md.size)
    if any(d < 0 for d in shape) or len(md.chunks) > MAX_CHUNKS:
        raise _refuse(path, fqn, f"claims shape {shape} in {len(md.chunks)} chunks")
    boxes, volume = [], 0
    for c in md.chunks:
        off, size = list(c.offsets), list(c.sizes)
        if (
            len(off) != len(shape)
            or len(size) != len(shape)
            or any(o < 0 or s < 0 or o + s > d for o, s, d in zip(off, size, shape))
        ):
            raise _refuse(path, fqn, f"has a chunk {off} + {size} outside its shape {shape}")
        n = math.prod(size)
        info = meta.storage_data.get(MetadataIndex(fqn, off))
        if info is None or (n and info.length < n * md.properties.dtype.itemsize):
            raise _refuse(path, fqn, f"has a chunk at {off} of {n} elements its file lacks")
        if n:
            boxes.append((off, size))
            volume += n
    if volume != math.prod(shape):
        raise _refuse(
            path, fqn, f"has chunks of {volume} elements, not the {math.prod(shape)} of {shape}"
        )
    boxes.sort()
    for i, (a_off, a_size) in enumerate(boxes):
        for b_off, b_size in boxes[i + 1 :]:
            if all(
                bo < ao + asz and ao < bo + bsz
                for ao, asz, bo, bsz in zip(a_off, a_size, b_off, b_size)
            ):
                raise _refuse(path, fqn, f"has overlapping chunks at {a_off} and {b_off}")
            if len(shape) == 1:
                break  # sorted 1-D pieces: only the next one can overlap


def dcp_load(state: dict, pinned: Pinned, **kwargs) -> None:
    """`dcp.load` of a pinned version through the safe reader and planner; DCP's
    `CheckpointException` (a `BaseException`) becomes a `CheckpointError`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.load(state, storage_reader=SafeReader(pinned), planner=SafePlanner(), **kwargs)
    except CheckpointException as e:
        raise CheckpointError(
            f"{pinned.path}: reading failed on ranks {sorted(e.failures)}: {e}"
        ) from e
