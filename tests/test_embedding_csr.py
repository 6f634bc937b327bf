"""HugeCTR's CSR input (minidist/embedding/csr.py): the converters agree with each other and
with the sample-major layout written out by hand; every bad input is refused with an error
that names the argument, before any table changes."""

import pytest
import torch

from minidist.embedding.csr import check_csr, csr_from_ids, csr_from_slots, to_csr
from minidist.embedding.distributed import DistributedSlotSparseEmbeddingHash
from minidist.embedding.hash_table import HashTableFullError
from minidist.embedding.layers import HashEmbeddingBag

# 3 samples, 2 slots; slot 1 of sample 1 is empty, a key repeats, negative keys.
PER_SLOT = [[[1], [2, 2], [-3]], [[10, 11], [], [-(1 << 63)]]]


def test_slots_to_sample_major_csr():
    values, offsets = csr_from_slots(PER_SLOT, slots=2)
    # bags: (s0 slot0, s0 slot1, s1 slot0, s1 slot1, s2 slot0, s2 slot1)
    assert values.tolist() == [1, 10, 11, 2, 2, -3, -(1 << 63)]
    assert offsets.tolist() == [0, 1, 3, 5, 5, 6, 7]
    assert values.dtype == offsets.dtype == torch.int64
    assert torch.equal(values, to_csr([[1], [10, 11], [2, 2], [], [-3], [-(1 << 63)]])[0])
    check_csr(values, offsets, "ok")


def test_ids_to_csr_equals_slots_to_csr():
    """The same occurrences as (key, sample, slot) triples, shuffled across bags."""
    triples = [
        (s_keys, b, s)
        for s, col in enumerate(PER_SLOT)
        for b, bag in enumerate(col)
        for s_keys in bag
    ]
    order = [4, 0, 3, 6, 1, 5, 2]  # within a bag (10 before 11, the two 2s) input order
    keys, samples, slots = (torch.tensor([triples[i][j] for i in order]) for j in range(3))
    values, offsets = csr_from_ids(keys, samples, slots, batch_size=3, slots=2)
    want_values, want_offsets = csr_from_slots(PER_SLOT)
    assert torch.equal(values, want_values) and torch.equal(offsets, want_offsets)


def test_converter_errors_name_the_argument():
    with pytest.raises(ValueError, match="slots=3 does not fit per_slot_keys, which has 2"):
        csr_from_slots(PER_SLOT, slots=3)
    with pytest.raises(ValueError, match=r"same number of samples, got \[3, 2\]"):
        csr_from_slots([PER_SLOT[0], PER_SLOT[1][:2]])
    with pytest.raises(TypeError, match=r"per_slot_keys\[1\]\[0\] must hold int keys.*1.5"):
        csr_from_slots([[[1]], [[1.5]]])
    with pytest.raises(TypeError, match=r"bags\[0\] must be an int64 tensor, got torch.int32"):
        to_csr([torch.tensor([1], dtype=torch.int32)])
    with pytest.raises(ValueError, match=r"bags\[0\] holds a key outside int64"):
        to_csr([[1 << 63]])
    k = torch.tensor([1, 2])
    with pytest.raises(ValueError, match=r"slot_ids\[1\]=2 is out of range.*slots=2"):
        csr_from_ids(k, torch.tensor([0, 0]), torch.tensor([0, 2]), 1, 2)
    with pytest.raises(ValueError, match=r"sample_ids\[0\]=-1 is out of range.*batch_size=1"):
        csr_from_ids(k, torch.tensor([-1, 0]), torch.tensor([0, 1]), 1, 2)
    with pytest.raises(TypeError, match="keys must be an int64 tensor, got torch.float32"):
        csr_from_ids(k.float(), torch.tensor([0, 0]), torch.tensor([0, 1]), 1, 2)
    with pytest.raises(ValueError, match="slot_ids must be 1-D with one entry per key"):
        csr_from_ids(k, torch.tensor([0, 0]), torch.tensor([0]), 1, 2)
    with pytest.raises(ValueError, match="slots=0 must be an int > 0"):
        csr_from_ids(k, torch.tensor([0, 0]), torch.tensor([0, 1]), 1, 0)


def test_layers_refuse_bad_batches_before_any_change():
    layer = HashEmbeddingBag(4, 2)
    weight = layer.weight.detach().clone()
    values = torch.tensor([1, 2, 3], dtype=torch.int64)
    bad = [
        (TypeError, "values must be an int64 tensor", (values.int(), torch.tensor([0, 3]))),
        (TypeError, "row_offsets must be an int64 tensor", (values, torch.tensor([0, 3.0]))),
        (ValueError, "row_offsets must start at 0, got 1", (values, torch.tensor([1, 3]))),
        (
            ValueError,
            r"never decrease, got row_offsets\[1\]=2 > row_offsets\[2\]=1",
            (values, torch.tensor([0, 2, 1, 3])),
        ),
        (ValueError, r"end at len\(values\)=3, got 2", (values, torch.tensor([0, 2]))),
        (HashTableFullError, "capacity=4", to_csr([[1, 2], [3, 4, 5]])),  # 5 keys, room for 4
    ]
    for error, message, batch in bad:
        with pytest.raises(error, match=message):
            layer(*batch)
        assert layer.table.size == 0 and torch.equal(layer.weight.detach(), weight)
    distributed = DistributedSlotSparseEmbeddingHash(4, 2, slots=2)
    with pytest.raises(ValueError, match="3 bags, not a multiple of slots=2"):
        distributed(*to_csr([[1], [2], [3]]))  # refused before any collective
    assert distributed.local.table.size == 0
