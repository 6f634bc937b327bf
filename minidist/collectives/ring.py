"""Ring all-reduce built from send/recv: a reduce-scatter followed by an all-gather.

Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of
workstations" (J. Parallel Distrib. Comput. 69(2)), section 3; the algorithm behind
Horovod and NCCL's ring.

The tensor is cut into N chunks. In N-1 reduce-scatter steps every rank sends one chunk to
its right neighbour and adds the chunk arriving from its left, so afterwards rank r holds
the full sum of chunk (r+1) mod N. In N-1 all-gather steps the finished chunks travel once
more around the ring. Each rank sends 2(N-1) chunks of S/N bytes: 2(N-1)/N·S, independent
of N for large N, which is why the ring is bandwidth optimal.

This is for teaching; `comm.all_reduce` is what minidist's techniques use.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import comm


def ring_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Sum `tensor` over the ranks of `group`, in place, with 2(N-1) send/recv steps."""
    n = dist.get_world_size(group)
    if n == 1:
        return tensor
    rank = dist.get_rank(group)
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(n))
    right, left = ranks[(rank + 1) % n], ranks[(rank - 1) % n]
    flat = tensor.reshape(-1)
    padded = torch.zeros(-(-flat.numel() // n) * n, dtype=flat.dtype, device=flat.device)
    padded[: flat.numel()] = flat
    chunks = padded.chunk(n)
    incoming = torch.empty_like(chunks[0])

    for step in range(n - 1):  # reduce-scatter: accumulate one chunk per step
        send_idx, recv_idx = (rank - step) % n, (rank - step - 1) % n
        works = comm.batch_isend_irecv(
            [("send", chunks[send_idx], right), ("recv", incoming, left)], group=group
        )
        for w in works:
            w.wait()
        chunks[recv_idx].add_(incoming)

    for step in range(n - 1):  # all-gather: pass the finished chunks around
        send_idx, recv_idx = (rank + 1 - step) % n, (rank - step) % n
        works = comm.batch_isend_irecv(
            [("send", chunks[send_idx], right), ("recv", incoming, left)], group=group
        )
        for w in works:
            w.wait()
        chunks[recv_idx].copy_(incoming)

    tensor.copy_(padded[: flat.numel()].view(tensor.shape))
    return tensor
