"""The data a hash table's slots hold, and the hash that places a key among them.

A table is two slot arrays: `slot_keys` (int64, `num_slots + 1` entries, the last a scratch
target for idle lanes' compare-and-swap in `kernels.py`; `EMPTY_KEY`, int64's minimum, marks
an empty slot) and `slot_rows` (int64, `num_slots` entries, -1 where empty), with
`num_slots` a power of two. A key's home slot is `fmix64(key) & (num_slots - 1)`:
MurmurHash3's 64-bit finalizer (Appleby, MurmurHash3, 2011). `hash_table.HashTable` owns the
arrays; `probing.py` (torch) and `kernels.py` (Triton) probe the arrays they are given.
"""

from __future__ import annotations

import torch

EMPTY_KEY = -(1 << 63)  # int64 min marks an empty slot
_LOW31 = (1 << 31) - 1
_FMIX_C1 = 0xFF51AFD7ED558CCD - (1 << 64)
_FMIX_C2 = 0xC4CEB9FE1A85EC53 - (1 << 64)


def fmix64(keys: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 64-bit finalizer on int64 (wrapping multiply, logical shifts)."""
    k = keys ^ ((keys >> 33) & _LOW31)
    k = k * _FMIX_C1
    k = k ^ ((k >> 33) & _LOW31)
    k = k * _FMIX_C2
    return k ^ ((k >> 33) & _LOW31)
