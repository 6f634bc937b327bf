"""The bytes lesson 00's ring algorithms send, as functions: defined here once.

A ring cuts a tensor of `numel` elements into N chunks of ceil(numel/N) (the last padded)
and every step sends one chunk to the right neighbour (Patarasuk & Yuan 2009, section 3):
the all-reduce takes 2(N-1) steps, the all-gather N-1. Per rank that is 2(N-1)/N·S and
(N-1)/N·S for an S-byte tensor that N divides, the factors `minidist.comm.ring_bytes` (and
NCCL-tests' bus bandwidth) use.
"""

from __future__ import annotations


def chunk_numel(numel: int, world_size: int) -> int:
    """Elements in one ring chunk: the tensor padded to a multiple of N, cut in N."""
    return -(-numel // world_size)


def ring_all_reduce_steps(world_size: int) -> int:
    """N-1 reduce-scatter steps, then N-1 all-gather steps."""
    return 2 * (world_size - 1)


def ring_all_reduce_bytes(numel: int, world_size: int, element_size: int = 4) -> int:
    """Bytes one rank sends in a ring all-reduce of `numel` elements: 2(N-1) padded chunks."""
    return ring_all_reduce_steps(world_size) * chunk_numel(numel, world_size) * element_size


def ring_all_gather_bytes(chunk: int, world_size: int, element_size: int = 4) -> int:
    """Bytes one rank sends in a ring all-gather of `chunk` elements per rank: N-1 chunks."""
    return (world_size - 1) * chunk * element_size
