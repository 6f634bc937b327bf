"""A GPU-style hash table: int64 keys -> rows of a value table, HugeCTR's embedding index.

HugeCTR (NVIDIA Merlin HugeCTR docs, "Embedding" / `HashTable`; Wang et al. 2022, "Merlin
HugeCTR: GPU-accelerated Recommender System Training and Inference") keeps each embedding
table as a hash table from an arbitrary int64 feature key to a row of a dense value table
[capacity, D]. This is that table:

- open addressing with linear probing (Knuth, TAOCP vol. 3, 6.4, algorithm L); the slot of
  a key is `fmix64(key) mod num_slots` (MurmurHash3's finalizer), `num_slots` a power of two;
- insert claims an empty slot with compare-and-swap and takes its row from an atomic
  counter, so rows are exactly 0..size-1 in claim order (the lock-free scheme of
  Alcantara et al. 2009, "Real-time parallel hashing on the GPU", and of cuDF/cuCollections'
  `static_map`, on which HugeCTR's table is built);
- find returns -1 for a missing key;
- the load factor stays at most `max_load` (0.75): `num_slots` is sized for `capacity`
  rows, and an insert that would exceed `capacity` raises `HashTableFullError` naming the
  capacity before changing anything; `grow()` rehashes into a larger table, every key
  keeping its row (so a value table only needs to be extended).

Every key is allowed, negative included. The slot array marks an empty slot with int64's
minimum, so that one key lives beside the slots (`_min_key_row`), on both back ends.

Two back ends of the same algorithm: Triton kernels (`kernels.py`; each launch inserts
distinct keys, deduplicated here first) and pure torch (`probing.py`, the CPU fallback and
the reference; contending inserts into one empty slot are resolved as the CAS would, lowest
lane first).
The default is Triton on a GPU and torch elsewhere; `backend=` forces one (Triton on a CPU
needs `TRITON_INTERPRET=1`). Not done here: deletion, eviction (HierarchicalKV's buckets),
concurrent insert and find in one launch. The torch-native equivalent of the whole layer
is a dense `nn.Embedding` over keys mapped beforehand (TorchRec's `EmbeddingBagCollection`
with a pre-hashed id space; Ivchenko et al. 2022, "TorchRec", RecSys).
"""

from __future__ import annotations

import math
import os

import torch

from .probing import torch_find, torch_insert
from .slots import EMPTY_KEY, fmix64  # noqa: F401 (importable from here, as before)

BACKENDS = ("triton", "torch")


class HashTableFullError(RuntimeError):
    """An insert would put more keys in the table than its capacity."""


def resolve_backend(backend: str | None, device: torch.device) -> str:
    """Triton on a GPU, torch elsewhere; a forced Triton on a CPU needs the interpreter."""
    if backend is None:
        return "triton" if device.type == "cuda" else "torch"
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: must be one of {BACKENDS} or None (automatic)")
    if backend == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            f"backend='triton' on device={device}: Triton runs on a CUDA device, or on the CPU "
            "only when TRITON_INTERPRET=1 is set before torch and triton are imported"
        )
    return backend


def check_keys(keys, who: str, name: str = "keys") -> None:
    if not isinstance(keys, torch.Tensor) or keys.dtype != torch.int64:
        got = keys.dtype if isinstance(keys, torch.Tensor) else type(keys).__name__
        raise TypeError(f"{who}: {name} must be an int64 tensor, got {got}")


class HashTable:
    """int64 key -> row in [0, capacity); see the module docstring."""

    def __init__(self, capacity: int, *, max_load: float = 0.75, device=None, backend=None):
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
            raise ValueError(f"HashTable: capacity={capacity!r} must be an int > 0 (not a bool)")
        if not 0 < max_load < 1:
            raise ValueError(f"HashTable: max_load={max_load!r} must be in (0, 1)")
        self.device = torch.device(device if device is not None else "cpu")
        self.backend = resolve_backend(backend, self.device)
        self.max_load = max_load
        self._allocate(capacity)
        self._counter = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._min_key_row = -1

    def _allocate(self, capacity: int) -> None:
        self.capacity = capacity
        self.num_slots = 1 << max(1, math.ceil(math.log2(math.ceil(capacity / self.max_load))))
        # One extra key slot: the scratch target of idle lanes' compare-and-swap (kernels.py).
        self._slot_keys = torch.full((self.num_slots + 1,), EMPTY_KEY, device=self.device)
        self._slot_rows = torch.full((self.num_slots,), -1, device=self.device)

    @property
    def size(self) -> int:
        return int(self._counter.item())

    def __len__(self) -> int:
        return self.size

    @property
    def load_factor(self) -> float:
        return self.size / self.num_slots

    # -- the public operations ------------------------------------------------------------

    def find(self, keys: torch.Tensor) -> torch.Tensor:
        """The row of each key, -1 where the key is not in the table (same shape)."""
        check_keys(keys, "HashTable.find")
        flat = keys.reshape(-1).to(self.device)
        # Both back ends give EMPTY_KEY -1 (its probe stops at an empty slot, row -1).
        rows = self._find(flat) if self.size else torch.full_like(flat, -1)
        if self._min_key_row >= 0:
            rows.masked_fill_(flat == EMPTY_KEY, self._min_key_row)
        return rows.reshape(keys.shape)

    def insert(self, keys: torch.Tensor) -> torch.Tensor:
        """Insert the missing keys and return every key's row (same shape). Raises
        `HashTableFullError` before any change when the new keys would exceed capacity."""
        check_keys(keys, "HashTable.insert")
        flat = keys.reshape(-1).to(self.device)
        uniq, inverse = torch.unique(flat, return_inverse=True)  # sorted: EMPTY_KEY first
        rows = self.find(uniq)
        missing = (rows < 0).nonzero().view(-1)
        n_new, size = missing.numel(), self.size
        if size + n_new > self.capacity:
            raise HashTableFullError(
                f"HashTable.insert: {n_new} new keys would bring the size from {size} to "
                f"{size + n_new}, over capacity={self.capacity} (max_load={self.max_load} of "
                f"{self.num_slots} slots); call grow() or build a larger table"
            )
        new_keys = uniq.index_select(0, missing)
        if n_new and int(new_keys[0]) == EMPTY_KEY:
            self._min_key_row = size
            rows[missing[0]] = size
            self._counter += 1
            missing, new_keys = missing[1:], new_keys[1:]
        if new_keys.numel():
            rows.index_copy_(0, missing, self._insert(new_keys, None))
        return rows.index_select(0, inverse).reshape(keys.shape)

    def grow(self, new_capacity: int | None = None) -> None:
        """Rehash into a table for `new_capacity` rows (default twice as many); every key
        keeps its row."""
        new_capacity = 2 * self.capacity if new_capacity is None else new_capacity
        if not isinstance(new_capacity, int) or new_capacity <= self.capacity:
            raise ValueError(
                f"HashTable.grow: new_capacity={new_capacity!r} must be an int > "
                f"capacity={self.capacity}"
            )
        used = self._slot_keys[:-1] != EMPTY_KEY
        keys, rows = self._slot_keys[:-1][used], self._slot_rows[used]
        self._allocate(new_capacity)
        if keys.numel():
            self._insert(keys, rows)

    def items(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, rows) of every stored key, sorted by key: the table's portable dump."""
        used = self._slot_keys[:-1] != EMPTY_KEY
        keys, rows = self._slot_keys[:-1][used], self._slot_rows[used]
        if self._min_key_row >= 0:
            keys = torch.cat([keys.new_tensor([EMPTY_KEY]), keys])
            rows = torch.cat([rows.new_tensor([self._min_key_row]), rows])
        order = torch.argsort(keys)
        return keys[order], rows[order]

    # -- back ends: distinct keys, none equal to EMPTY_KEY --------------------------------

    def _find(self, keys: torch.Tensor) -> torch.Tensor:
        if self.backend == "triton":
            return _triton_find(self, keys)
        return torch_find(self._slot_keys, self._slot_rows, keys)

    def _insert(self, keys: torch.Tensor, rows_in: torch.Tensor | None) -> torch.Tensor:
        """Insert distinct absent keys; rows from the counter, or `rows_in` (rehash)."""
        if self.backend == "triton":
            return _triton_insert(self, keys, rows_in)
        return torch_insert(self._slot_keys, self._slot_rows, self._counter, keys, rows_in)


def _block(n: int) -> int:
    return min(1024, max(16, 1 << (n - 1).bit_length()))


def _triton_find(t: HashTable, keys: torch.Tensor) -> torch.Tensor:
    from .kernels import find_kernel

    keys = keys.contiguous()
    rows = torch.empty_like(keys)
    n, block = keys.numel(), _block(keys.numel())
    find_kernel[(-(-n // block),)](
        keys, rows, t._slot_keys, t._slot_rows, n, t.num_slots - 1, EMPTY_KEY, BLOCK=block
    )
    return rows


def _triton_insert(t: HashTable, keys: torch.Tensor, rows_in: torch.Tensor | None):
    from .kernels import insert_kernel

    keys = keys.contiguous()
    rows = torch.empty_like(keys)
    n, block = keys.numel(), _block(keys.numel())
    insert_kernel[(-(-n // block),)](
        keys,
        rows if rows_in is None else rows_in.contiguous(),
        rows,
        t._slot_keys,
        t._slot_rows,
        t._counter,
        n,
        t.num_slots - 1,
        EMPTY_KEY,
        ASSIGN=rows_in is None,
        BLOCK=block,
    )
    return rows
