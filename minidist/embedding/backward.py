"""HugeCTR's embedding backward: sort the occurrences by row, dedup, one gradient per row.

HugeCTR (NVIDIA Merlin HugeCTR, `SparseEmbeddingFunctors::backward` and the "update_params"
kernels behind `DistributedSlotSparseEmbeddingHash`; Wang et al. 2022, "Merlin HugeCTR",
section 3) turns the top gradient of the pooled vectors [bags, D] into one gradient per
*unique* row of the value table, in four steps that are each a function here:

1. `occurrence_bags(row_offsets)`: the bag (sample·slot) of every key occurrence, the CSR
   offsets expanded;
2. `sort_and_dedup(rows)`: a stable sort of the occurrences by row (equal rows keep their
   occurrence order, as a radix sort does), and the runs of equal rows;
   rows [4,5,1,2,3,5,1,3,2,1] -> sorted [1,1,1,2,2,3,3,4,5,5], run_offsets [0,3,5,7,8,10],
   unique rows [1,2,3,4,5];
3. `segment_sum_gradients(...)`: for each run, the sum of weight[i]·grad_pooled[bag[i]] over
   its occurrences (weight 1 for sum, 1/count for mean), divided by the loss scale
   (mixed-precision training scales the loss up; the gradient comes back down here);
4. the optimizer updates only those unique rows (`optim.py`).

Sorting makes the sum per row deterministic and lets one thread own a row; the atomic
alternative (every occurrence adds into its row, `index_add_`) needs no sort and is what
`SparseSGD` does in HugeCTR's "atomic" SGD path. `gather_scale_scatter_add` is the one
primitive both use (Triton kernel or torch `index_add_`). The torch-native equivalent is
`torch.unique(rows, return_inverse=True)` followed by `index_add_`, which is what
`nn.EmbeddingBag(sparse=True)` does before it coalesces the sparse gradient.
"""

from __future__ import annotations

import torch


def occurrence_bags(row_offsets: torch.Tensor) -> torch.Tensor:
    """The bag id of every value of a CSR batch: bag b repeated row_offsets[b+1]-row_offsets[b]
    times (int64, length row_offsets[-1])."""
    counts = row_offsets[1:] - row_offsets[:-1]
    return torch.repeat_interleave(torch.arange(counts.numel(), device=row_offsets.device), counts)


def sort_and_dedup(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(order, unique_rows, run_offsets): `rows[order]` is sorted by row, equal rows in their
    occurrence order (a stable sort); run u is `rows[order][run_offsets[u]:run_offsets[u+1]]`,
    all equal to `unique_rows[u]`."""
    order = torch.argsort(rows, stable=True)
    unique_rows, counts = torch.unique_consecutive(rows[order], return_counts=True)
    run_offsets = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=rows.device)
    run_offsets[1:] = torch.cumsum(counts, 0)
    return order, unique_rows, run_offsets


def _launch_kernel(src, src_idx, scale, dst, dst_idx) -> None:
    from .kernels import gather_scale_scatter_add_kernel

    n, d = src_idx.numel(), src.shape[1]
    if n == 0:
        return
    block_n = min(256, max(16, 1 << (n - 1).bit_length()))
    block_d = min(128, max(16, 1 << (d - 1).bit_length()))
    gather_scale_scatter_add_kernel[(-(-n // block_n),)](
        src.contiguous(),
        src_idx.contiguous(),
        scale.contiguous(),
        dst,
        dst_idx.contiguous(),
        n,
        d,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
    )


def gather_scale_scatter_add(backend: str, src, src_idx, scale, dst, dst_idx) -> None:
    """dst[dst_idx[i]] += scale[i] · src[src_idx[i]] for every i (in place on `dst`): the
    bag forward (src = table, dst = bags) and the backward (src = bag grads, dst = rows)."""
    if backend == "triton":
        _launch_kernel(src, src_idx, scale, dst, dst_idx)
    else:
        dst.index_add_(0, dst_idx, src[src_idx] * scale[:, None])


def segment_sum_gradients(
    rows: torch.Tensor,
    bags: torch.Tensor,
    grad_pooled: torch.Tensor,
    weights: torch.Tensor,
    loss_scale: float = 1.0,
    *,
    backend: str = "torch",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(unique_rows, row_grads): row_grads[u] = Σ_{i: rows[i] = unique_rows[u]}
    weights[i]·grad_pooled[bags[i]] / loss_scale. Occurrences with a row < 0 (a key missing
    at evaluation) are skipped. `unique_rows` is sorted ascending."""
    if not loss_scale > 0:
        raise ValueError(f"segment_sum_gradients: loss_scale={loss_scale!r} must be > 0")
    if not rows.shape == bags.shape == weights.shape:
        raise ValueError(
            "segment_sum_gradients: rows, bags and weights must have one entry per occurrence, "
            f"got shapes {tuple(rows.shape)}, {tuple(bags.shape)}, {tuple(weights.shape)}"
        )
    valid = rows >= 0
    rows, bags, weights = rows[valid], bags[valid], weights[valid]
    order, unique_rows, run_offsets = sort_and_dedup(rows)
    run = occurrence_bags(run_offsets)  # the run (unique row) of each sorted occurrence
    row_grads = grad_pooled.new_zeros(unique_rows.numel(), grad_pooled.shape[1])
    gather_scale_scatter_add(
        backend,
        grad_pooled.contiguous(),
        bags[order],
        weights[order].to(grad_pooled.dtype),
        row_grads,
        run,
    )
    if loss_scale != 1.0:
        row_grads = row_grads / loss_scale
    return unique_rows, row_grads
