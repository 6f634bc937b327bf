"""What one rank holds of the training state, in layout-free terms (lessons 17 and 18).

Every parallel layout splits a logical tensor (a parameter of the one-process model, or one
of its optimizer states) in at most two ways, one after the other:
- a **box**: a rectangle of the logical tensor (tensor parallelism cuts rows or columns;
  context and pipeline parallelism leave parameters whole, so their box is the whole tensor);
- a **flat range** of that box's row-major flattening (ZeRO and FSDP flatten what a rank
  holds and keep one contiguous shard of it).

A `Piece` records both, so a checkpoint can store each rank's data under the one-process
name and a new layout can read back exactly the elements it needs (DCP's resharding),
whatever the two layouts are. Replicas (data parallelism, or the copies tensor parallelism
keeps of a norm weight) hold identical pieces: exactly one of them is the `owner`, the one
that saves.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Piece:
    """One rank's part of one logical tensor.

    - `name`: the one-process key (`"blocks.0.attn.q_proj.weight"`, or
      `"optim.<param name>.exp_avg"` for an optimizer state of that parameter);
    - `global_shape`: the logical tensor's shape;
    - `box_offsets`, `box_sizes`: the rectangle of the logical tensor the local tensor covers
      (the whole tensor when nothing cuts it);
    - `flat`: `(lo, hi)`, the range of the box's row-major flattening this rank keeps, or
      `None` for the whole box;
    - `tensor`: the local data, a view of the live storage: box-shaped when `flat` is None,
      else 1-D with `hi - lo` elements;
    - `owner`: True on exactly one of the ranks that hold identical copies.
    """

    name: str
    global_shape: tuple[int, ...]
    box_offsets: tuple[int, ...]
    box_sizes: tuple[int, ...]
    flat: tuple[int, int] | None
    tensor: torch.Tensor
    owner: bool = True

    def __post_init__(self) -> None:
        if not (len(self.global_shape) == len(self.box_offsets) == len(self.box_sizes)):
            raise ValueError(f"{self.name}: global_shape, box_offsets and box_sizes differ in rank")
        for o, s, g in zip(self.box_offsets, self.box_sizes, self.global_shape):
            if o < 0 or s < 0 or o + s > g:
                raise ValueError(
                    f"{self.name}: box {self.box_offsets}+{self.box_sizes} "
                    f"leaves the tensor of shape {self.global_shape}"
                )
        numel = 1
        for s in self.box_sizes:
            numel *= s
        if self.flat is None:
            if tuple(self.tensor.shape) != tuple(self.box_sizes):
                raise ValueError(
                    f"{self.name}: tensor of shape {tuple(self.tensor.shape)} "
                    f"for a box of {self.box_sizes}"
                )
        else:
            lo, hi = self.flat
            if not 0 <= lo <= hi <= numel or self.tensor.numel() != hi - lo:
                raise ValueError(
                    f"{self.name}: flat range {self.flat} of a box of {numel} "
                    f"elements, tensor of {self.tensor.numel()}"
                )
