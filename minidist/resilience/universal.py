"""Universal checkpoints: every rank writes its pieces under layout-free names, and any other
layout reads back exactly the elements it needs.

DeepSpeed's Universal Checkpointing (Lian et al. 2024, "Universal Checkpointing: Efficient
and Flexible Checkpointing for Large Scale Distributed Training") turns each rank's shard
into per-parameter fragments with their place in the logical tensor, so that a run saved on
one layout (DP 128) resumes on another (TP 2 × DP 32). Here the fragments are the
rectangles of each `Piece` (`chunks.py`), written with `torch.distributed.checkpoint` under
the one-process model's names (`planners.py`): a load on any layout is DCP's resharding.

- `save(path, pieces, state, layout, group)` on every rank: each rank writes the pieces it
  owns, its random streams (`rng.<rank>.<stream>`) and rank 0 a JSON record (`layout`, the
  step, the global sample index, the loss scaler) as a uint8 tensor, so every byte of the
  checkpoint is a tensor with a checksum. minidist's checkpoint rules, through
  `minidist.checkpoint_files` and lesson 03's DCP helpers: written into
  `.<name>.unfinished`, held locked by rank 0 as every format's (`Staging`: a second save to
  the same path is refused while one runs), checksums recorded last, then renamed into
  place; an interrupted save leaves the previous checkpoint whole.
- `load(path, pieces, layout, group)` on every rank: refuses a checkpoint that cannot serve
  the pieces (a tensor missing on either side, another shape or dtype: a different number
  of layers, a different model) before anything changes, naming both layouts, and one whose
  metadata does not describe its files (the FSDP format's `cover`: every tensor's rectangles
  inside it, not overlapping, covering it exactly; the record plain data, each of its fields
  as `save` writes it and nothing else, its random streams stored: `checkpoint_schema`, a
  `CheckpointError` naming the field, also in `train --resume`'s parent); reads only the
  stored rectangles that overlap this rank's pieces, verifying each one's checksum; copies
  into the pieces only once every rank has read everything. Returns a `LoadReport`: the
  `TrainingState` and the bytes this rank read beside the bytes of its own pieces.

Not here: storage other than a file system every rank sees; a different optimizer or
dtype between save and load (refused); DCP's own collectives (plan exchange) go through
`torch.distributed`, which the ledger does not see.
Native equivalent: `torch.distributed.checkpoint` with DTensor state dicts (torchtitan).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from .. import comm
from ..checkpoint_files import CHECKSUMS, CheckpointError, Staging, is_complete, unfinished_path
from ..checkpoint_pin import ATTEMPTS, pin, raise_everywhere, same_everywhere
from ..checkpoint_schema import check_universal_record, tensor_entry
from ..fsdp.checkpoint_safe import cover, read_metadata, seal
from ..pieces import Piece
from .chunks import Chunk, piece_chunks, piece_nbytes
from .planners import ChunkLoadPlanner, ChunkSavePlanner, VerifyingReader
from .state import TrainingState

FORMAT = "minidist-universal-checkpoint/1"
RECORD = "minidist.record"
RECORD_KEYS = {"format", "layout", "world", "step", "samples", "scaler", "rng_streams"}


class CheckpointLayoutError(ValueError):
    """A checkpoint that cannot serve the requested layout; nothing was changed."""


@dataclass
class LoadReport:
    state: TrainingState
    bytes_read: int  # bytes of the checkpoint this rank read from disk
    payload_read: int  # of which tensor elements (the rest: each rectangle's framing)
    bytes_wanted: int  # bytes of the rectangles it asked for (its pieces, each once)
    shard_bytes: int  # bytes of this rank's pieces
    rng_restored: bool  # the saved layout is this one: state.rng holds this rank's streams
    saved_layout: dict


# -- save ----------------------------------------------------------------------------------------
def save_chunks(pieces: list[Piece], state: TrainingState, layout: dict | None, group) -> list:
    """What this rank writes: its owned pieces' rectangles, its streams, rank 0 the record."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    chunks, seen = [], set()
    for p in pieces:
        if not isinstance(p, Piece):
            raise TypeError(f"save: pieces must be minidist.pieces.Piece, got {type(p).__name__}")
        if p.owner:
            for c in piece_chunks(p):
                if (c.name, c.offsets) in seen:
                    raise ValueError(f"save: two owned pieces of {c.name} start at {c.offsets}")
                seen.add((c.name, c.offsets))
                chunks.append(c)
    for name, t in state.rng.items():
        chunks.append(_whole(f"rng.{rank}.{name}", t))
    if rank == 0:
        record = {
            "format": FORMAT,
            "layout": layout or {},
            "world": world,
            "step": state.step,
            "samples": state.samples,
            "scaler": state.scaler,
            "rng_streams": sorted(state.rng),
        }
        data = json.dumps(record, sort_keys=True).encode()
        chunks.append(_whole(RECORD, torch.frombuffer(bytearray(data), dtype=torch.uint8)))
    return chunks


def _whole(name: str, t: torch.Tensor) -> Chunk:
    return Chunk(name, tuple(t.shape), (0,) * t.dim(), tuple(t.shape), t)


def write(path: str | os.PathLike, chunks: list[Chunk], group=None) -> None:
    """Write `chunks` (every rank its own) as the checkpoint `path`, atomically.

    Rank 0 claims the staging folder (`checkpoint_files.Staging`, the lock every format
    takes): a second save to `path` while one runs is refused on every rank of the second
    world, and no rank returns before this save's own files are in place."""
    path = Path(path)
    if path.exists() and not is_complete(path):
        raise FileExistsError(
            f"save: {path} exists and is not a checkpoint (no {CHECKSUMS}): refusing to replace it"
        )
    staging, error = None, None
    if dist.get_rank(group) == 0:
        try:
            staging = Staging(path, "save")
        except (CheckpointError, OSError) as e:
            error = str(e)
    try:
        raise_everywhere(group, error)
        try:
            dcp.save(
                {},
                checkpoint_id=unfinished_path(path),
                planner=ChunkSavePlanner(chunks),
                process_group=group,
            )
        except CheckpointException as e:  # a BaseException, on every rank: made ordinary
            raise RuntimeError(
                f"save: writing failed on ranks {sorted(e.failures)}: {path} is unchanged "
                f"({next(iter(e.failures.values()), '')!r})"
            ) from e
        comm.barrier(group, tag="checkpoint")  # every rank's files are on disk
        error = seal(staging, FORMAT, path) or error
        raise_everywhere(group, error)  # nobody returns before `path` is in place
    finally:
        if staging is not None:
            staging.release()


def save(
    path,
    pieces: list[Piece],
    state: TrainingState | None = None,
    layout: dict | None = None,
    group=None,
) -> None:
    """Write a universal checkpoint of `pieces` and `state` (every rank of `group` calls it)."""
    write(path, save_chunks(pieces, state or TrainingState(), layout, group), group)


# -- load ----------------------------------------------------------------------------------------
def read_record(pinned) -> tuple[dict, object, dict]:
    """(checksums record, DCP metadata, the JSON record) of a pinned version
    (`checkpoint_pin.pin`: every file held open, so the checks and the reads see one
    version), verified: the files' sizes, the metadata describing them (`cover`: each
    tensor's rectangles inside its shape, not overlapping, covering it exactly, as the FSDP
    format checks) and the record's bytes, read as plain data only."""
    path, sums = pinned.path, pinned.record
    if sums.get("format") != FORMAT:
        raise CheckpointError(f"{path} is a {sums.get('format')!r} checkpoint, not {FORMAT!r}")
    for name, rec in sums["files"].items():
        pinned.check(name, rec)  # sizes; .metadata's bytes too
    meta = read_metadata(pinned)
    cover(meta, sums, path)
    if RECORD not in meta.state_dict_metadata:
        raise CheckpointError(f"{path} holds no {RECORD}")
    stored = [v for k, v in meta.storage_data.items() if k.fqn == RECORD]
    if len(stored) != 1:
        raise CheckpointError(f"{path}: {RECORD} is stored in {len(stored)} places, not 1")
    (info,) = stored
    blob = pinned.read(info.relative_path, info.offset, info.length)
    if _sha(blob) != _checksums(sums).get((info.relative_path, info.offset)):
        raise CheckpointError(f"{path}/{info.relative_path}: {RECORD} differs from its checksum")
    try:
        data = torch.load(io.BytesIO(blob), weights_only=True)
        if not (isinstance(data, torch.Tensor) and data.dtype == torch.uint8 and data.dim() == 1):
            raise TypeError(f"a {type(data).__name__}, not a 1-D uint8 tensor")
        record = json.loads(bytes(data.tolist()).decode())
        if not isinstance(record, dict) or not RECORD_KEYS <= record.keys():
            raise ValueError(f"not a JSON object with {sorted(RECORD_KEYS)}")
    except Exception as e:  # pickle.UnpicklingError, a forged type: never raw to the caller
        raise CheckpointError(
            f"{path}/{info.relative_path}: {RECORD} is not a record this format writes "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from e
    where = f"{path}/{info.relative_path}: {RECORD}"
    check_universal_record(record, meta, where, RECORD_KEYS, FORMAT)  # every field's type
    for name in meta.state_dict_metadata:  # this format stores tensors only
        tensor_entry(meta, path / ".metadata", name)
    return sums, meta, record


def _sha(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def _checksums(sums: dict) -> dict[tuple[str, int], str]:
    return {(e["file"], e["start"]): e["sha256"] for e in sums.get("entries", [])}


def _payloads(meta) -> dict[tuple[str, int], int]:
    """(file, offset) -> bytes of the elements of the rectangle stored there."""
    out = {}
    for index, info in meta.storage_data.items():
        md = meta.state_dict_metadata[index.fqn]
        for c in md.chunks:
            if tuple(c.offsets) == tuple(index.offset or ()):
                size = math.prod(c.sizes) * md.properties.dtype.itemsize
                out[(info.relative_path, info.offset)] = size
    return out


def _layers(names) -> int:
    found = {int(m.group(1)) for n in names if (m := re.search(r"(?:blocks|layers)\.(\d+)\.", n))}
    return max(found) + 1 if found else 0


def _refusals(meta, pieces: list[Piece], group) -> list[str]:
    """Why the checkpoint cannot serve these pieces on any rank of `group` (empty: it can)."""
    saved = {
        k: v
        for k, v in meta.state_dict_metadata.items()
        if k != RECORD and not k.startswith("rng.")
    }
    problems, wanted = [], {}
    for p in pieces:
        wanted[p.name] = (tuple(p.global_shape), p.tensor.dtype)
    for name, (shape, dtype) in sorted(wanted.items()):
        md = saved.get(name)
        if md is None:
            problems.append(f"{name} is not in the checkpoint")
        elif tuple(md.size) != shape:
            problems.append(f"{name} is {tuple(md.size)} in the checkpoint, {shape} here")
        elif md.properties.dtype != dtype:
            problems.append(f"{name} is {md.properties.dtype} in the checkpoint, {dtype} here")
    everyone = [None] * dist.get_world_size(group)
    comm.all_gather_object(everyone, (sorted(wanted), problems), group=group, tag="checkpoint")
    union = set().union(*(set(names) for names, _ in everyone))
    problems = sorted(set().union(*(set(p) for _, p in everyone)))
    unused = sorted(set(saved) - union)
    if unused:
        problems.append(f"the checkpoint holds {len(unused)} tensors no rank loads: {unused[:3]}")
    if problems and _layers(saved) != _layers(union):
        problems.insert(
            0, f"the checkpoint has {_layers(saved)} layers, the model {_layers(union)}"
        )
    return problems


def load(
    path, pieces: list[Piece], layout: dict | None = None, group=None, strict: bool = True
) -> LoadReport:
    """Fill `pieces` from the checkpoint at `path` (saved on any layout); every rank calls it.

    `strict`: refuse a checkpoint holding tensors that no rank's pieces load (another model).
    """
    path = Path(path)
    for _ in range(ATTEMPTS):  # every rank the same version: a save may replace it meanwhile
        pinned = None
        try:
            pinned = pin(path)
            read = read_record(pinned)
        except Exception as e:  # on every rank, so that none waits in a collective
            if pinned is not None:
                pinned.close()
            same_everywhere(group, None, e)
        if same_everywhere(group, pinned.digest):
            break
        pinned.close()
    else:
        raise CheckpointError(f"load: the ranks kept reading different versions of {path}")
    with pinned:
        return _load(pinned, read, pieces, layout, group, strict)


def _load(
    pinned, read, pieces: list[Piece], layout: dict | None, group, strict: bool
) -> LoadReport:
    path = pinned.path
    sums, meta, record = read
    problems = _refusals(meta, pieces, group)
    if not strict:
        problems = [p for p in problems if "no rank loads" not in p]
    if problems:
        raise CheckpointLayoutError(
            f"{path} was saved by layout {record['layout']} ({record['world']} ranks) and "
            f"cannot serve layout {layout or {}} ({dist.get_world_size(group)} ranks): "
            + "; ".join(problems[:4])
            + (f"; and {len(problems) - 4} more" if len(problems) > 4 else "")
        )
    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    same = record["layout"] == json.loads(json.dumps(layout or {})) and record["world"] == world
    wanted: dict[tuple[str, tuple], torch.Tensor] = {}
    targets: list[tuple[torch.Tensor, tuple]] = []
    for p in pieces:
        for c in piece_chunks(p):
            key = (c.name, c.offsets)
            if key in wanted and tuple(wanted[key].shape) != c.sizes:
                raise ValueError(f"load: two pieces of {c.name} start at {c.offsets}")
            wanted.setdefault(key, torch.empty(c.sizes, dtype=c.tensor.dtype, device="cpu"))
            targets.append((c.tensor, key))
    rng_keys, missing = {}, None
    if same:  # this rank's streams (rank 0's were checked with the record): every rank agrees
        try:
            for name in record["rng_streams"]:
                tensor_entry(meta, path / ".metadata", f"rng.{rank}.{name}", torch.uint8, 1)
        except CheckpointError as e:
            missing = f"{e} (rank {rank}'s random stream {name!r}, which the record lists)"
        raise_everywhere(group, missing)
        for name in record["rng_streams"]:
            md = meta.state_dict_metadata[f"rng.{rank}.{name}"]
            rng_keys[name] = (f"rng.{rank}.{name}", (0,))
            wanted[rng_keys[name]] = torch.empty(md.size, dtype=torch.uint8, device="cpu")
    reader = VerifyingReader(pinned, _checksums(sums), _payloads(meta))
    try:
        dcp.load({}, storage_reader=reader, planner=ChunkLoadPlanner(wanted), process_group=group)
    except CheckpointException as e:  # nothing changed yet: the pieces are untouched
        raise CheckpointError(
            f"{path}: reading failed on ranks {sorted(e.failures)}: "
            f"{next(iter(e.failures.values()), '')!r}"
        ) from e
    with torch.no_grad():
        for tensor, key in targets:
            tensor.copy_(wanted[key])
    state = TrainingState(
        step=record["step"],
        samples=record["samples"],
        scaler=record["scaler"],
        rng={name: wanted[k] for name, k in rng_keys.items()},
    )
    nbytes = sum(
        math.prod(t.shape) * t.element_size()
        for k, t in wanted.items()
        if not k[0].startswith("rng.")
    )
    shard = sum(piece_nbytes(p) for p in pieces)
    return LoadReport(
        state, reader.bytes_read, reader.payload_read, nbytes, shard, same, record["layout"]
    )
