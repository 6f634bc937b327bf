"""`cuda_peaks()`: the peak CUDA memory each rank of a world reached, measured on the rank.

`torch.cuda.max_memory_allocated` counts the allocations of one process, so a parent cannot
read its ranks' peaks. While a `with cuda_peaks() as peaks:` block is open in the parent,
every NCCL world `launch` starts resets each rank's peak statistics
(`torch.cuda.reset_peak_memory_stats`) just before the rank function runs and reads
`torch.cuda.max_memory_allocated()` just after it returns; `peaks` gets one list per world,
each rank's bytes in rank order. Gloo worlds (ranks on the CPU) and worlds joined under
torchrun add nothing, so outside NCCL the block changes nothing. `python -m minidist
gpucheck` opens one around each tour row, to print rank 0's peak beside the row's formula.
"""

from __future__ import annotations

import contextlib

import torch

_active: list[list[list[int]]] = []  # the open blocks' lists, innermost last


@contextlib.contextmanager
def cuda_peaks():
    """Collect, per NCCL world launched inside the block, each rank's peak CUDA bytes."""
    peaks: list[list[int]] = []
    _active.append(peaks)
    try:
        yield peaks
    finally:
        _active.remove(peaks)


def wanted(backend: str) -> bool:
    """Whether the ranks of a world on `backend` launched now should measure their peaks."""
    return bool(_active) and backend == "nccl"


def record(world: list[int]) -> None:
    """Add one world's per-rank peaks to every open block."""
    for peaks in _active:
        peaks.append(list(world))


def reset_on_rank() -> None:
    """On a rank, before its function: start counting the peak from here."""
    torch.cuda.reset_peak_memory_stats()


def read_on_rank() -> int:
    """On a rank, after its function: the most bytes allocated since `reset_on_rank`."""
    return int(torch.cuda.max_memory_allocated())
