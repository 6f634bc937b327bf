"""Which positions of the sequence each of c ranks holds: contiguous or zig-zag.

Liu et al. 2023, "Ring Attention with Blockwise Transformers for Near-Infinite Context",
section 3: the sequence is split in blocks over the c ranks of a ring. With a causal mask a
contiguous split is unbalanced: rank c-1's queries see every key, rank 0's only its own
block. The zig-zag split (Megatron-LM's context parallelism, `get_batch_on_this_cp_rank`,
and ring-flash-attention's `zigzag_ring_flash_attn_func`) cuts the sequence in 2c chunks and
gives rank r chunks r and 2c-1-r, one early and one late, so that every rank has the same
causal work. (Brandon et al. 2023, "Striped Attention", balance it differently: token j on
rank j mod c.)
"""

from __future__ import annotations

import torch

LAYOUTS = ("contiguous", "zigzag")


def chunks_of(layout: str, c: int) -> int:
    """Chunks of the sequence: c for a contiguous split, 2c for zig-zag."""
    if layout not in LAYOUTS:
        raise ValueError(f"context parallelism: layout must be one of {LAYOUTS}, got {layout!r}")
    return c if layout == "contiguous" else 2 * c


def rank_chunks(layout: str, c: int, rank: int) -> list[int]:
    """The chunk indices rank `rank` holds, in order."""
    return [rank] if layout == "contiguous" else [rank, 2 * c - 1 - rank]


def check_split(seq: int, c: int, layout: str) -> int:
    """The chunk length; a sequence that does not divide into the layout's chunks is refused."""
    n = chunks_of(layout, c)
    if seq % n:
        raise ValueError(
            f"context parallelism: the sequence length {seq} is not divisible by {n} "
            f"({'c' if layout == 'contiguous' else '2c'} chunks for the {layout} split, c={c})"
        )
    return seq // n


def positions(seq: int, c: int, rank: int, layout: str = "zigzag", device=None) -> torch.Tensor:
    """The global positions of rank `rank`'s tokens, in the order it holds them."""
    size = check_split(seq, c, layout)
    device = "cpu" if device is None else device  # named: the guard refuses an implicit one
    return torch.cat(
        [
            torch.arange(k * size, (k + 1) * size, device=device)
            for k in rank_chunks(layout, c, rank)
        ]
    )
