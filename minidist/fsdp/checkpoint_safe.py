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
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from ..checkpoint_files import (
    CHECKSUMS,
    CheckpointError,
    check_file,
    file_record,
    read_json,
    sha256_file,
    write_json,
)

_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_ALLOWED = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        allowed = (
            (module, name) in _ALLOWED
            or (module == _METADATA_MODULE and not name.startswith("__"))
            or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
        )
        if not allowed:
            raise CheckpointError(
                f".metadata refers to {module}.{name}, which a checkpoint's metadata never "
                "holds: refused unread (loading it could run code from the file)"
            )
        return super().find_class(module, name)


def read_metadata(path: Path) -> Metadata:
    """DCP's metadata of the checkpoint at `path`, unpickled with the restricted unpickler."""
    try:
        with open(path / ".metadata", "rb") as f:
            meta = _MetadataUnpickler(f).load()
    except CheckpointError as e:
        raise CheckpointError(f"{path}/{e}") from None
    except Exception as e:  # truncated or garbled: pickle raises many kinds
        raise CheckpointError(f"{path / '.metadata'} cannot be read ({e!r})") from e
    if not isinstance(meta, Metadata):
        raise CheckpointError(f"{path / '.metadata'} holds a {type(meta).__name__}, not DCP's")
    return meta


class SafeReader(FileSystemReader):
    """DCP's file reader with `.metadata` read by the restricted unpickler."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        meta = read_metadata(Path(self.path))
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


def verify(path: Path) -> Metadata:
    """Check every file and chunk against the checksums; return the (safely read) metadata."""
    record = read_json(path / CHECKSUMS)
    check_file(path, ".metadata", record["files"][".metadata"])
    meta = read_metadata(path)
    for name, rec in record["files"].items():
        if name != ".metadata":
            check_file(path, name, rec)
    for e in record["entries"]:
        if sha256_file(path / e["file"], e["start"], e["length"]) != e["sha256"]:
            raise CheckpointError(
                f"{path / e['file']}: tensor {e['entry']} differs from the checksum recorded "
                f"at save (bytes {e['start']}..{e['start'] + e['length']})"
            )
    return meta


def dcp_load(state: dict, path: Path, **kwargs) -> None:
    """`dcp.load` through the safe reader and planner; DCP's `CheckpointException` (a
    `BaseException`) becomes a `CheckpointError`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.load(state, storage_reader=SafeReader(os.fspath(path)), planner=SafePlanner(), **kwargs)
    except CheckpointException as e:
        raise CheckpointError(f"{path}: reading failed on ranks {sorted(e.failures)}: {e}") from e
