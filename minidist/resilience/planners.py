"""DCP planners that write and read rectangles of logical tensors, and a reader that counts.

Why custom planners (torch 2.13, gloo, CPU): DCP's default planners take a state dict of
tensors, DTensors or ShardedTensors. A piece (box, then flat range) is none of these, and a
rank may hold several rectangles of one tensor (a flat range crosses rows; Q, K and V are
three boxes of one fused weight). A `ShardedTensor` (`init_from_local_shards` with a
`ShardMetadata` per rectangle) could say so, but builds every tensor with a collective and
is deprecated in favour of DTensor, whose placements cannot say "rows 3..7 of this box".
The planner interface can: `ChunkSavePlanner` emits one `WriteItem` per rectangle
(`ChunkStorageMetadata(offsets, sizes)` of the global tensor), and `ChunkLoadPlanner` asks
DCP's own resharding (`create_read_items_for_chunk_list`) which stored rectangles overlap
each rectangle this rank wants. DCP's global plan still checks that the saved rectangles
neither overlap nor leave holes.

`VerifyingReader` reads each stored rectangle once, checks its SHA-256 against the record
written at save (`minidist.checksums.json`) before DCP deserialises it (with
`torch.load(weights_only=True)`), and counts the bytes: a rank verifies and reads only what
it needs, not the whole checkpoint.
"""

from __future__ import annotations

import hashlib
import io

import torch
from torch.distributed.checkpoint import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    SavePlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from ..checkpoint_files import CheckpointError
from ..fsdp.checkpoint_safe import SafePlanner, SafeReader
from .chunks import Chunk


def _key(index: MetadataIndex) -> tuple[str, tuple[int, ...]]:
    return index.fqn, tuple(index.offset or ())


class ChunkSavePlanner(DefaultSavePlanner):
    """Writes `chunks` (this rank's owned rectangles) under their logical names."""

    def __init__(self, chunks: list[Chunk]):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.chunks = {(c.name, c.offsets): c for c in chunks}

    def create_local_plan(self) -> SavePlan:
        items = [
            WriteItem(
                index=MetadataIndex(c.name, torch.Size(c.offsets)),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(torch.Size(c.offsets), torch.Size(c.sizes)),
                    properties=TensorProperties.create_from_tensor(c.tensor),
                    size=torch.Size(c.global_shape),
                ),
            )
            for c in self.chunks.values()
        ]
        self.plan = SavePlan(items)
        return self.plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor:
        return self.chunks[_key(write_item.index)].tensor.detach().cpu()


class ChunkLoadPlanner(SafePlanner):
    """Reads into `wanted`: (name, offsets) -> a tensor shaped like that rectangle."""

    def __init__(self, wanted: dict[tuple[str, tuple[int, ...]], torch.Tensor]):
        super().__init__(flatten_state_dict=False)
        self.wanted = wanted

    def create_local_plan(self) -> LoadPlan:
        by_name: dict[str, list[ChunkStorageMetadata]] = {}
        for (name, offsets), t in self.wanted.items():
            chunk = ChunkStorageMetadata(torch.Size(offsets), torch.Size(t.shape))
            by_name.setdefault(name, []).append(chunk)
        items = []
        for name, chunks in by_name.items():
            items += create_read_items_for_chunk_list(
                name, self.metadata.state_dict_metadata[name], chunks
            )
        self.plan = LoadPlan(items)
        return self.plan

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        return self.wanted[_key(index)]


class VerifyingReader(SafeReader):
    """DCP's safe file reader that checks each stored rectangle's SHA-256 as it reads it
    and counts the bytes read: `bytes_read` from the files, `payload_read` of them the
    tensors' elements (the rest is each stored rectangle's `torch.save` framing)."""

    def __init__(self, pinned, checksums: dict[tuple[str, int], str], payloads: dict):
        super().__init__(pinned)
        self.checksums, self.payloads = checksums, payloads
        self.bytes_read = self.payload_read = 0
        self._last: tuple[tuple[str, int], bytes] | None = None

    def _slice_file(self, file, sinfo) -> io.BytesIO:
        key = (sinfo.relative_path, sinfo.offset)
        if self._last is None or self._last[0] != key:  # DCP asks again for each overlap
            file.seek(sinfo.offset)
            data = file.read(sinfo.length)
            self.bytes_read += len(data)
            self.payload_read += self.payloads.get(key, 0)
            if hashlib.sha256(data).hexdigest() != self.checksums.get(key):
                raise CheckpointError(
                    f"{self.path}/{sinfo.relative_path}: the bytes {sinfo.offset}.."
                    f"{sinfo.offset + sinfo.length} differ from the checksum recorded at save"
                )
            self._last = (key, data)
        return io.BytesIO(self._last[1])
