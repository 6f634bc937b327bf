"""Lesson 11, HugeCTR-style hash-table embeddings (notebook `notebooks/11_hash_embeddings.ipynb`).

NVIDIA Merlin HugeCTR (docs: "Sparse Embedding", `DistributedSlotSparseEmbeddingHash`,
`LocalizedSlotSparseEmbeddingHash`; Wang et al. 2022, "Merlin HugeCTR: GPU-accelerated
Recommender System Training and Inference"): int64 feature keys mapped by a GPU hash table
to rows of a value table, pooled per slot, split over ranks by key or by slot.

- `hash_table.py`: the table (linear probing, CAS insert, atomic row counter, grow);
  `probing.py`: its torch back end; `kernels.py`: its Triton kernels and the embedding-bag
  scatter kernel
- `criteo.py`, `ctr.py`: synthetic Criteo-like data; Wide&Deep and DLRM on these layers
- `bench.py`: `python -m minidist bench embedding`
- `csr.py`: HugeCTR's CSR input, converters from per-slot lists and (key, sample, slot) ids
- `layers.py`: `HashEmbeddingBag` (CSR input, sum/mean, loss scale)
- `optim.py`: sparse SGD (momentum local/global), Adagrad, Adam (local/global)
- `backward.py`: the sort/dedup backward (occurrence bags, runs of equal rows, per-row sums)
- `distributed.py`: the distributed and localized slot placements over `minidist.comm`
- `checkpoint.py`: key-sorted save/load of a table and its optimizer state (a shard per rank,
  saved atomically, checksummed, resharded onto any world on load); `state_dict.py` the
  key-sorted state dicts it writes
- `theory.py`: the bytes each placement sends, as functions
"""

from .backward import occurrence_bags, segment_sum_gradients, sort_and_dedup
from .csr import csr_from_ids, csr_from_slots, to_csr
from .distributed import (
    DistributedSlotSparseEmbeddingHash,
    LocalizedSlotSparseEmbeddingHash,
    key_owner,
)
from .hash_table import HashTable, HashTableFullError
from .layers import HashEmbeddingBag, embedding_bag, key_init
from .optim import SparseAdagrad, SparseAdam, SparseSGD

__all__ = [
    "HashTable",
    "HashTableFullError",
    "HashEmbeddingBag",
    "SparseSGD",
    "SparseAdagrad",
    "SparseAdam",
    "embedding_bag",
    "key_init",
    "to_csr",
    "csr_from_slots",
    "csr_from_ids",
    "DistributedSlotSparseEmbeddingHash",
    "LocalizedSlotSparseEmbeddingHash",
    "key_owner",
    "occurrence_bags",
    "sort_and_dedup",
    "segment_sum_gradients",
]
