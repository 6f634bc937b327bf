"""HugeCTR's CSR input for a multi-slot embedding, its converters and its checks.

HugeCTR (NVIDIA Merlin HugeCTR docs, "Data Set Formats", the "Norm" and "Raw" readers'
`DataReaderSparseParam`, and `CSR` in `HugeCTR/include/common.hpp`) hands an embedding a
batch of B samples with S slots as one CSR: `values`, the int64 keys, and `row_offsets`,
of length B·S + 1, sample-major: bag b = (sample b // S, slot b % S) holds
`values[row_offsets[b]:row_offsets[b + 1]]`. A bag may be empty.

- `to_csr(bags)`: a list of per-bag key lists (already sample-major) -> CSR;
- `csr_from_slots(per_slot_keys)`: per_slot_keys[s][b] the keys of sample b in slot s
  (how a reader holds one column per feature field) -> CSR;
- `csr_from_ids(keys, sample_ids, slot_ids, batch_size, slots)`: one (key, sample, slot)
  per occurrence (a COO form) -> CSR, occurrences of a bag in their input order;
- `check_csr(values, row_offsets, who)`: the rules a layer checks before it changes
  anything (int64, 1-D, row_offsets from 0, never decreasing, ending at len(values)).

Every error names the argument and the rule it broke. The torch-native equivalent is
`torchrec.KeyedJaggedTensor` (keys per feature, lengths, offsets; feature-major).
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral

import torch

from .hash_table import check_keys


def _offsets(lengths: torch.Tensor) -> torch.Tensor:
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    offsets[1:] = torch.cumsum(lengths, 0)
    return offsets


def _key_list(keys, who: str, name: str) -> list[int]:
    if isinstance(keys, torch.Tensor):
        check_keys(keys, who, name)
        return keys.reshape(-1).tolist()
    keys = list(keys)
    bad = next((k for k in keys if not isinstance(k, Integral) or isinstance(k, bool)), None)
    if bad is not None:
        raise TypeError(f"{who}: {name} must hold int keys (int64), got {bad!r}")
    if any(not -(1 << 63) <= k < (1 << 63) for k in keys):
        raise ValueError(f"{who}: {name} holds a key outside int64's range")
    return keys


def to_csr(bags: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-bag key lists -> (values, row_offsets), HugeCTR's CSR input."""
    keys = [_key_list(b, "to_csr", f"bags[{i}]") for i, b in enumerate(bags)]
    lengths = torch.tensor([len(b) for b in keys], dtype=torch.int64, device="cpu")
    values = torch.tensor([k for b in keys for k in b], dtype=torch.int64, device="cpu")
    return values, _offsets(lengths)


def csr_from_slots(
    per_slot_keys: Sequence[Sequence[Sequence[int]]], slots: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """per_slot_keys[s][b] (keys of sample b in slot s) -> (values, row_offsets), bags
    sample-major. `slots`, when given, must equal len(per_slot_keys)."""
    who = "csr_from_slots"
    if slots is not None and (not isinstance(slots, int) or slots != len(per_slot_keys)):
        raise ValueError(
            f"{who}: slots={slots!r} does not fit per_slot_keys, which has "
            f"{len(per_slot_keys)} slots"
        )
    if not per_slot_keys:
        raise ValueError(f"{who}: per_slot_keys must hold at least one slot")
    batch = {len(column) for column in per_slot_keys}
    if len(batch) != 1:
        sizes = [len(column) for column in per_slot_keys]
        raise ValueError(
            f"{who}: every slot of per_slot_keys must hold the same number of samples, got "
            f"{sizes} (slot by slot)"
        )
    (samples,) = batch
    bags = [
        _key_list(per_slot_keys[s][b], who, f"per_slot_keys[{s}][{b}]")
        for b in range(samples)
        for s in range(len(per_slot_keys))
    ]
    return to_csr(bags)


def csr_from_ids(
    keys: torch.Tensor,
    sample_ids: torch.Tensor,
    slot_ids: torch.Tensor,
    batch_size: int,
    slots: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Occurrence i = (keys[i], sample sample_ids[i], slot slot_ids[i]) -> (values,
    row_offsets) with batch_size·slots bags, sample-major; a bag's keys keep input order."""
    who = "csr_from_ids"
    for name, value in (("batch_size", batch_size), ("slots", slots)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{who}: {name}={value!r} must be an int > 0")
    for name, t in (("keys", keys), ("sample_ids", sample_ids), ("slot_ids", slot_ids)):
        check_keys(t, who, name)
        if t.dim() != 1 or t.numel() != keys.numel():
            raise ValueError(
                f"{who}: {name} must be 1-D with one entry per key ({keys.numel()}), got shape "
                f"{tuple(t.shape)}"
            )
    for name, t, bound in (("sample_ids", sample_ids, batch_size), ("slot_ids", slot_ids, slots)):
        out = (t < 0) | (t >= bound)
        if out.any():
            i = int(out.nonzero()[0])
            raise ValueError(
                f"{who}: {name}[{i}]={int(t[i])} is out of range: must be in [0, {bound}) "
                f"({'batch_size' if name == 'sample_ids' else 'slots'}={bound})"
            )
    bag = sample_ids * slots + slot_ids
    order = torch.argsort(bag, stable=True)
    lengths = torch.bincount(bag, minlength=batch_size * slots)
    return keys[order], _offsets(lengths)


def check_csr(values: torch.Tensor, row_offsets: torch.Tensor, who: str) -> None:
    """Clear errors for a malformed CSR batch (raised before any state changes)."""
    check_keys(values, who, "values")
    check_keys(row_offsets, who, "row_offsets")
    if values.dim() != 1 or row_offsets.dim() != 1 or row_offsets.numel() < 1:
        raise ValueError(
            f"{who}: values and row_offsets must be 1-D (row_offsets of length bags + 1), got "
            f"shapes {tuple(values.shape)} and {tuple(row_offsets.shape)}"
        )
    if row_offsets[0] != 0:
        raise ValueError(f"{who}: row_offsets must start at 0, got {int(row_offsets[0])}")
    falls = row_offsets[1:] < row_offsets[:-1]
    if falls.any():
        i = int(falls.nonzero()[0])
        raise ValueError(
            f"{who}: row_offsets must never decrease, got row_offsets[{i}]="
            f"{int(row_offsets[i])} > row_offsets[{i + 1}]={int(row_offsets[i + 1])}"
        )
    if row_offsets[-1] != values.numel():
        raise ValueError(
            f"{who}: row_offsets must end at len(values)={values.numel()}, "
            f"got {int(row_offsets[-1])}"
        )
