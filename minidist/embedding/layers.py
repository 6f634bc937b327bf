"""Hash embeddings: keys -> rows through `HashTable`, pooled per bag.

HugeCTR's sparse embeddings (NVIDIA Merlin HugeCTR docs, "Embedding Training Cache" and
"Sparse Embedding" layers; Wang et al. 2022, "Merlin HugeCTR") take each batch in CSR form:
`values` (the int64 keys) and `row_offsets` (length bags + 1, sample-major when a sample has
several slots: bag b = sample b // slots, slot b % slots), and pool each bag with a combiner:

- sum, or mean (divided by the number of keys in the bag; an empty bag gives zeros);
- in training new keys are inserted into the table, at evaluation a missing key
  contributes zero (it still counts in a mean's denominator, as in HugeCTR).

The pooling is one fused gather-scale-scatter (`kernels.gather_scale_scatter_add_kernel`,
or `index_add_` in the torch back end): out[bag(i)] += scale(i) * weight[row(i)]. Its
backward is the same kernel the other way round after HugeCTR's dedup: the rows of the
occurrences are sorted and split into runs of equal rows (`backward.py`), and each unique
row receives the sum of its occurrences' scaled top gradients. The gradient of the value
table is a sparse COO tensor of those rows, like `nn.EmbeddingBag(sparse=True)`.

The sparse optimizers that read this gradient (`SparseSGD`, `SparseAdagrad`, `SparseAdam`)
live in `optim.py`; `loss_scale` divides the gradient (mixed precision's scaled loss). The
torch-native equivalent is `nn.EmbeddingBag(mode=..., sparse=True, include_last_offset=True)`
over keys mapped to rows beforehand.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .backward import gather_scale_scatter_add, occurrence_bags, segment_sum_gradients
from .csr import check_csr, to_csr  # noqa: F401  (to_csr: its home before csr.py)
from .hash_table import HashTable, fmix64
from .optim import SparseAdagrad, SparseSGD  # noqa: F401  (their home before optim.py)

MODES = ("sum", "mean")


def key_init(keys: torch.Tensor, dim: int, scale: float = 0.05) -> torch.Tensor:
    """The starting vector of each key, a function of the key alone (uniform in
    [-scale, scale) from fmix64 bits), so every layout of the tables starts alike."""
    bits = fmix64(fmix64(keys)[:, None] + torch.arange(1, dim + 1, device=keys.device))
    unit = ((bits >> 11) & ((1 << 52) - 1)).to(torch.float64) / float(1 << 52)
    return ((2 * unit - 1) * scale).to(torch.float32)


class _PoolFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight, rows, bags, scale, num_bags, backend, loss_scale, row_offsets):
        # A CSR batch comes as `row_offsets` (bags None until backward needs them) and, for
        # the sum, no `scale` (1 per key); other callers give each occurrence's bag.
        present = rows >= 0  # missing keys (evaluation) add zero
        if scale is None:
            scale = present.to(weight.dtype)
        else:
            scale = torch.where(present, scale.to(weight.dtype), 0.0)
        if backend == "torch" and row_offsets is not None:  # torch's fused bag kernel
            out = F.embedding_bag(
                rows.clamp(min=0),
                weight.detach(),
                row_offsets[:-1],
                mode="sum",
                per_sample_weights=scale,
            )
        else:
            bags = occurrence_bags(row_offsets) if bags is None else bags
            out = weight.new_zeros(num_bags, weight.shape[1])
            gather_scale_scatter_add(backend, weight.detach(), rows.clamp(min=0), scale, out, bags)
        ctx.bags_from_offsets = bags is None
        ctx.save_for_backward(rows, row_offsets if bags is None else bags, scale)
        ctx.backend, ctx.weight_shape, ctx.loss_scale = backend, weight.shape, loss_scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        rows, bags, scale = ctx.saved_tensors
        if ctx.bags_from_offsets:
            bags = occurrence_bags(bags)
        # HugeCTR's backward (backward.py): sort by row, runs of equal rows, one sum per run.
        unique_rows, grad_rows = segment_sum_gradients(
            rows, bags, grad_out, scale, ctx.loss_scale, backend=ctx.backend
        )
        grad = torch.sparse_coo_tensor(
            unique_rows[None],
            grad_rows,
            ctx.weight_shape,
            is_coalesced=True,
            check_invariants=False,
        )
        return grad, None, None, None, None, None, None, None


def pool(weight, rows, bags, scale, num_bags: int, backend="torch", loss_scale: float = 1.0):
    """out[bags[i]] += scale[i] · weight[rows[i]] into [num_bags, D] (rows of -1 add zero); the
    gradient of `weight` is sparse COO over the unique rows, divided by `loss_scale`."""
    return _PoolFunction.apply(weight, rows, bags, scale, num_bags, backend, loss_scale, None)


def embedding_bag(
    weight, rows, row_offsets, mode: str = "sum", backend: str = "torch", loss_scale: float = 1.0
):
    """Pool `weight[rows]` per bag of the CSR `row_offsets`; rows of -1 contribute zero. The
    gradient of `weight` (sparse COO, unique rows) is divided by `loss_scale`."""
    if mode not in MODES:
        raise ValueError(f"embedding_bag: mode={mode!r} must be one of {MODES}")
    if not loss_scale > 0:
        raise ValueError(f"embedding_bag: loss_scale={loss_scale!r} must be > 0")
    counts = row_offsets[1:] - row_offsets[:-1]
    scale = None  # the sum: 1 per key
    if mode == "mean":
        scale = (1 / counts.clamp(min=1).to(weight.dtype)).repeat_interleave(counts)
    return _PoolFunction.apply(
        weight, rows, None, scale, counts.numel(), backend, loss_scale, row_offsets
    )


class HashEmbeddingBag(nn.Module):
    """A value table [capacity, dim] indexed by a `HashTable` of int64 keys, pooled per bag.

    `forward(values, row_offsets)` takes HugeCTR's CSR batch (see `to_csr`) and returns
    [bags, dim]; in training new keys are inserted (their row set to `key_init(key)`, as
    HugeCTR initialises a row on insert), in eval mode missing keys give zero. The value
    table's gradient is divided by `loss_scale` (the factor the loss was multiplied by).
    A batch with more new keys than the table has room for raises `HashTableFullError`
    before any change; with `auto_grow=True` the layer calls `grow()` instead, which grows
    the hash table and the value table together (the optimizers in `optim.py` extend their
    state on their next step).
    """

    def __init__(
        self,
        capacity: int,
        dim: int,
        mode: str = "sum",
        *,
        max_load: float = 0.75,
        device=None,
        backend=None,
        init_scale: float = 0.05,
        loss_scale: float = 1.0,
        auto_grow: bool = False,
    ):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"HashEmbeddingBag: mode={mode!r} must be one of {MODES}")
        if not isinstance(dim, int) or dim <= 0:
            raise ValueError(f"HashEmbeddingBag: dim={dim!r} must be an int > 0")
        if not loss_scale > 0:
            raise ValueError(f"HashEmbeddingBag: loss_scale={loss_scale!r} must be > 0")
        self.loss_scale = loss_scale
        self.table = HashTable(capacity, max_load=max_load, device=device, backend=backend)
        self.mode, self.dim, self.init_scale, self.auto_grow = mode, dim, init_scale, auto_grow
        self.weight = nn.Parameter(torch.zeros(capacity, dim, device=self.table.device))

    @property
    def backend(self) -> str:
        return self.table.backend

    def rows(self, values: torch.Tensor) -> torch.Tensor:
        """Rows of the keys: inserted in training, -1 for a missing key in eval mode."""
        if not self.training:
            return self.table.find(values)
        size = self.table.size
        if self.auto_grow:
            needed = size + int((self.table.find(torch.unique(values)) < 0).sum())
            if needed > self.table.capacity:
                self.grow(max(2 * self.table.capacity, needed))
        rows = self.table.insert(values)
        new = rows >= size
        if new.any():
            with torch.no_grad():
                self.weight[rows[new]] = key_init(values[new], self.dim, self.init_scale)
        return rows

    @torch.no_grad()
    def grow(self, new_capacity: int | None = None) -> None:
        """Grow the hash table (`HashTable.grow`, every key keeps its row) and the value table
        to `new_capacity` rows (default twice as many); a pending gradient is extended too."""
        old = self.table.capacity
        self.table.grow(new_capacity)  # validates new_capacity before any change
        weight = self.weight.new_zeros(self.table.capacity, self.dim)
        weight[:old] = self.weight
        grad, self.weight.grad = self.weight.grad, None
        # The same Parameter object gets the new tensor (optimizers keep pointing at it) and
        # fresh autograd metadata (`.data =` would keep the old shape in a live graph).
        torch.utils.swap_tensors(self.weight, nn.Parameter(weight))
        if grad is not None and grad.is_sparse:
            grad = grad.coalesce()
            self.weight.grad = torch.sparse_coo_tensor(
                grad.indices(), grad.values(), weight.shape, check_invariants=False
            )
        elif grad is not None:
            self.weight.grad = torch.cat([grad, grad.new_zeros(weight.shape[0] - old, self.dim)])

    def forward(self, values: torch.Tensor, row_offsets: torch.Tensor) -> torch.Tensor:
        check_csr(values, row_offsets, "HashEmbeddingBag")
        rows = self.rows(values)
        return embedding_bag(
            self.weight, rows, row_offsets, self.mode, self.backend, self.loss_scale
        )

    def dump(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, vectors) sorted by key: the layer as a key -> vector map."""
        keys, rows = self.table.items()
        return keys, self.weight.detach()[rows]
