"""A piece as rectangles of the logical tensor: what a universal checkpoint stores and reads.

DCP (`torch.distributed.checkpoint`) describes a saved tensor as chunks, rectangles of the
global tensor (`ChunkStorageMetadata(offsets, sizes)`), and reshards on load by intersecting
the rectangles a rank wants with the rectangles on disk. A `minidist.pieces.Piece` is a box,
then maybe a flat range of the box's row-major flattening (ZeRO and FSDP): not a rectangle
in general. But a flat range [lo, hi) of a row-major box is at most 2·d - 1 rectangles for
a d-dimensional box (DeepSpeed's Universal Checkpointing, Lian et al. 2024, section 3, cuts
flat shards back into parameter fragments the same way):

    a partial first row  |  whole rows  |  a partial last row

where a partial row is the same problem one dimension down. Each rectangle is a contiguous
run of the flat range, so its data is a view of the piece's 1-D tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..pieces import Piece


@dataclass(frozen=True)
class Chunk:
    """A rectangle of the logical tensor `name` and the local data that fills it (a view)."""

    name: str
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    tensor: torch.Tensor  # shaped `sizes`

    @property
    def nbytes(self) -> int:
        return math.prod(self.sizes) * self.tensor.element_size()


def flat_range_boxes(sizes: tuple[int, ...], lo: int, hi: int) -> list[tuple[tuple, tuple]]:
    """The rectangles (offsets, sizes) of a `sizes`-shaped box that elements [lo, hi) of its
    row-major flattening fill, in flat order; at most 2·len(sizes) - 1 of them."""
    if lo >= hi:
        return []
    if not sizes:  # a 0-d tensor: its one element
        return [((), ())]
    row = math.prod(sizes[1:])  # elements per index of the first dimension
    first, last = lo // row, (hi - 1) // row
    rest = tuple(sizes[1:])

    def within(i: int, a: int, b: int) -> list[tuple[tuple, tuple]]:
        return [((i, *o), (1, *s)) for o, s in flat_range_boxes(rest, a - i * row, b - i * row)]

    if first == last and (lo % row or hi % row):
        return within(first, lo, hi)
    out = []
    start, stop = first, last + 1
    if lo % row:  # a partial first row
        out += within(first, lo, (first + 1) * row)
        start = first + 1
    if hi % row:  # a partial last row, after the whole ones
        stop = last
    if stop > start:
        out.append(((start, *[0] * len(rest)), (stop - start, *rest)))
    if hi % row:
        out += within(last, last * row, hi)
    return out


def piece_chunks(piece: Piece) -> list[Chunk]:
    """The rectangles of the logical tensor that `piece` covers, with views of its data."""
    base = piece.box_offsets
    if piece.flat is None:
        return [Chunk(piece.name, piece.global_shape, base, piece.box_sizes, piece.tensor)]
    chunks, pos = [], 0
    for offsets, sizes in flat_range_boxes(piece.box_sizes, *piece.flat):
        n = math.prod(sizes)
        chunks.append(
            Chunk(
                piece.name,
                piece.global_shape,
                tuple(b + o for b, o in zip(base, offsets)),
                sizes,
                piece.tensor.reshape(-1)[pos : pos + n].view(sizes),
            )
        )
        pos += n
    return chunks


def piece_nbytes(piece: Piece) -> int:
    return piece.tensor.numel() * piece.tensor.element_size()
