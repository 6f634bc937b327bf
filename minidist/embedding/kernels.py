"""The Triton kernels of lesson 11: hash-table insert/find and the embedding-bag scatter.

The same algorithms in pure torch live beside their callers (`hash_table.py`, `layers.py`)
and are the reference these kernels are tested against, on CPU under `TRITON_INTERPRET=1`.

Written for the interpreter as much as for a GPU:
- few programs, large blocks: the interpreter runs programs one after another (about 1 ms
  per program per op), so a launch uses a handful of programs of up to 1024 lanes;
- `tl.atomic_cas` takes no mask under the interpreter: a lane with nothing to do points at a
  scratch slot (index `num_slots`, always holding the empty key) and swaps empty for empty;
- every mask is a vector condition: a mask never mixes a vector and a scalar condition
  (triton 3.9's interpreter rejects that), loop counters enter masks as `tl.full` vectors.

The hash is MurmurHash3's 64-bit finalizer `fmix64` (Appleby, MurmurHash3, 2011), on int64
with logical shifts written as an arithmetic shift and a mask, so that torch (which has no
uint64 arithmetic on CPU) computes the same bits.
"""

from __future__ import annotations

import triton
import triton.language as tl

# fmix64 (MurmurHash3's finaliser), written out as `slots.fmix64` does in torch: the
# multipliers 0xff51afd7ed558ccd and 0xc4ceb9fe1a85ec53 as two's-complement int64 literals,
# and `& (2^31 - 1)` after `>> 33` making the arithmetic shift a logical one.


@triton.jit
def _fmix64(k):
    k = k ^ ((k >> 33) & 2147483647)
    k = k * -49064778989728563  # 0xff51afd7ed558ccd
    k = k ^ ((k >> 33) & 2147483647)
    k = k * -4265267296055464877  # 0xc4ceb9fe1a85ec53
    k = k ^ ((k >> 33) & 2147483647)
    return k


@triton.jit
def insert_kernel(
    keys_ptr,  # [n] int64, distinct, none equal to `empty`
    rows_in_ptr,  # [n] int64 rows to store (ASSIGN=False: rehash) or unused
    rows_out_ptr,  # [n] int64: the row of each key
    slot_keys_ptr,  # [num_slots + 1] int64, the last one is the scratch slot
    slot_rows_ptr,  # [num_slots] int64
    counter_ptr,  # [1] int64, the next free row
    n,
    slot_mask,
    empty,
    ASSIGN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < n
    key = tl.load(keys_ptr + offs, mask=inb, other=0)
    slot = _fmix64(key) & slot_mask
    row = tl.full([BLOCK], -1, tl.int64)
    empties = tl.full([BLOCK], 0, tl.int64) + empty
    scratch = slot_mask + 1
    zeros = tl.zeros([BLOCK], dtype=tl.int64)
    active = inb
    while tl.max(active.to(tl.int32), axis=0) > 0:
        target = tl.where(active, slot, scratch)
        old = tl.atomic_cas(slot_keys_ptr + target, empties, tl.where(active, key, empties))
        won = active & (old == empties)
        hit = active & (old == key)
        if ASSIGN:
            new_row = tl.atomic_add(counter_ptr + zeros, zeros + 1, mask=won)
        else:
            new_row = tl.load(rows_in_ptr + offs, mask=won, other=-1)
        tl.store(slot_rows_ptr + slot, new_row, mask=won)
        old_row = tl.load(slot_rows_ptr + slot, mask=hit, other=-1)
        row = tl.where(won, new_row, tl.where(hit, old_row, row))
        active = active & (won == 0) & (hit == 0)
        slot = tl.where(active, (slot + 1) & slot_mask, slot)
    tl.store(rows_out_ptr + offs, row, mask=inb)


@triton.jit
def find_kernel(
    keys_ptr,
    rows_out_ptr,
    slot_keys_ptr,
    slot_rows_ptr,
    n,
    slot_mask,
    empty,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < n
    key = tl.load(keys_ptr + offs, mask=inb, other=0)
    slot = _fmix64(key) & slot_mask
    row = tl.full([BLOCK], -1, tl.int64)
    active = inb
    while tl.max(active.to(tl.int32), axis=0) > 0:
        stored = tl.load(slot_keys_ptr + slot, mask=active, other=empty)
        hit = active & (stored == key)
        miss = active & (stored == empty)
        found = tl.load(slot_rows_ptr + slot, mask=hit, other=-1)
        row = tl.where(hit, found, row)
        active = active & (hit == 0) & (miss == 0)
        slot = tl.where(active, (slot + 1) & slot_mask, slot)
    tl.store(rows_out_ptr + offs, row, mask=inb)


@triton.jit
def gather_scale_scatter_add_kernel(
    src_ptr,  # [*, D] float rows to gather
    src_idx_ptr,  # [n] int64 row of src per item
    scale_ptr,  # [n] float factor per item (0 for a missing key)
    dst_ptr,  # [*, D] float rows to accumulate into
    dst_idx_ptr,  # [n] int64 row of dst per item
    n,
    D,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """dst[dst_idx[i]] += scale[i] * src[src_idx[i]] for every item i: the embedding bag's
    forward (src = table, dst = bags) and backward (src = bag grads, dst = unique rows)."""
    items = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_D)
    inb = items < n
    src_row = tl.load(src_idx_ptr + items, mask=inb, other=0)
    dst_row = tl.load(dst_idx_ptr + items, mask=inb, other=0)
    scale = tl.load(scale_ptr + items, mask=inb, other=0.0)
    for d0 in range(0, D, BLOCK_D):
        col = d0 + cols
        mask = inb[:, None] & (col < D)[None, :]
        vals = tl.load(src_ptr + src_row[:, None] * D + col[None, :], mask=mask, other=0.0)
        tl.atomic_add(
            dst_ptr + dst_row[:, None] * D + col[None, :], vals * scale[:, None], mask=mask
        )
