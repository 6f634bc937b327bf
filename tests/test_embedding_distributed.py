"""HugeCTR's distributed and localized slot embeddings on worlds of 2 and 4 against one
HashEmbeddingBag over the global batch, compared per output bag and as key-sorted
key -> vector dumps (never by row number); the bytes of the forward and of the whole step
(forward + backward) measured against theory.py exactly, for both distributed schemes
(reduce-scatter, HugeCTR's and the default; all-to-all, TorchRec's row-wise).

Tolerance: float32, the same products summed in a different order, 1e-6.
"""

import pytest
import torch
import torch.distributed as dist

import minidist
from minidist import comm
from minidist.embedding import theory
from minidist.embedding.distributed import (
    DistributedSlotSparseEmbeddingHash,
    LocalizedSlotSparseEmbeddingHash,
    key_owner,
)
from minidist.embedding.layers import HashEmbeddingBag, SparseSGD, to_csr

DIM, SAMPLES, STEPS, LR, TOL = 4, 3, 2, 0.1, 1e-6


def rank_bags(step: int, rank: int, slots: int) -> list[list[int]]:
    """Sample-major bags; slot s keys are s*1000 + a small (negative too) offset. Bags may be
    empty; at step 1 rank 1's bags all are (it sends no key at all)."""
    g = torch.Generator().manual_seed(100 * step + rank)
    bags = []
    for _ in range(SAMPLES):
        for s in range(slots):
            n = 0 if (step, rank) == (1, 1) else int(torch.randint(0, 4, (1,), generator=g))
            bags.append([s * 1000 + int(k) for k in torch.randint(-6, 7, (n,), generator=g)])
    return bags


def top_grad(step: int, rank: int, slots: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(7 + 100 * step + rank)
    return torch.randn(SAMPLES * slots, DIM, generator=g)


def build(kind: str, mode: str, placement: str, slots: int, scheme: str):
    if kind == "distributed":
        return DistributedSlotSparseEmbeddingHash(
            64, DIM, slots, mode, placement=placement, scheme=scheme
        )
    return LocalizedSlotSparseEmbeddingHash(64, DIM, slots, mode)


def run_rank(kind: str, mode: str, placement: str, slots: int, scheme: str):
    rank = dist.get_rank()
    layer = build(kind, mode, placement, slots, scheme)
    optimizer = SparseSGD([layer.local.weight], lr=LR)
    outs, sent = [], []
    for step in range(STEPS):
        with comm.record() as forward:
            out = layer(*to_csr(rank_bags(step, rank, slots)))
        optimizer.zero_grad()
        with comm.record() as backward:
            (out * top_grad(step, rank, slots)).sum().backward()
        optimizer.step()
        outs.append(out.detach())
        sent.append((forward.total_ring_bytes(), backward.total_ring_bytes()))
    return outs, sent, layer.dump()


def reference(world: int, mode: str, slots: int):
    layer = HashEmbeddingBag(512, DIM, mode)
    optimizer = SparseSGD([layer.weight], lr=LR)
    outs = []
    for step in range(STEPS):
        out = layer(*to_csr([b for r in range(world) for b in rank_bags(step, r, slots)]))
        optimizer.zero_grad()
        (out * torch.cat([top_grad(step, r, slots) for r in range(world)])).sum().backward()
        optimizer.step()
        outs.append(out.detach())
    return outs, layer.dump()


def expected_bytes(kind, mode, placement, scheme, world, step, rank, slots):
    """(forward, step) bytes of `rank` at `step`, from theory.py."""
    if kind == "distributed":
        owners = [
            key_owner(to_csr(rank_bags(step, r, slots))[0], world, placement) for r in range(world)
        ]
        to = torch.bincount(owners[rank], minlength=world).tolist()
        if scheme == "reduce_scatter":
            args = (to, rank, DIM, SAMPLES * slots, mode)
            return (
                theory.distributed_slot_reduce_scatter_forward_bytes(*args),
                theory.distributed_slot_reduce_scatter_step_bytes(*args),
            )
        frm = [int((owners[r] == rank).sum()) for r in range(world)]
        return (
            theory.distributed_slot_forward_bytes(to, frm, rank, DIM),
            theory.distributed_slot_step_bytes(to, frm, rank, DIM),
        )
    slot_owner = [s % world for s in range(slots)]
    bags = rank_bags(step, rank, slots)
    bags_to = [SAMPLES * slot_owner.count(r) for r in range(world)]
    keys_to = [
        sum(len(b) for i, b in enumerate(bags) if slot_owner[i % slots] == r) for r in range(world)
    ]
    bags_from = [SAMPLES * slot_owner.count(rank)] * world
    args = (bags_to, keys_to, bags_from, rank, DIM)
    return theory.localized_slot_forward_bytes(*args), theory.localized_slot_step_bytes(*args)


@pytest.mark.parametrize(
    "world,kind,mode,placement,slots,scheme",
    [
        (2, "distributed", "sum", "modulo", 3, "reduce_scatter"),
        (2, "distributed", "mean", "hashed", 3, "reduce_scatter"),
        (4, "distributed", "sum", "hashed", 3, "reduce_scatter"),
        (4, "distributed", "mean", "modulo", 3, "reduce_scatter"),
        (2, "distributed", "mean", "modulo", 3, "all_to_all"),
        (4, "distributed", "sum", "hashed", 3, "all_to_all"),
        (2, "localized", "mean", "modulo", 3, None),
        (4, "localized", "sum", "modulo", 5, None),  # rank 0 owns two slots
        (4, "localized", "mean", "modulo", 2, None),  # ranks 2 and 3 own no slot
    ],
)
def test_placements_equal_one_embedding(world, kind, mode, placement, slots, scheme):
    results = minidist.launch(run_rank, world, kind, mode, placement, slots, scheme)
    ref_outs, (ref_keys, ref_vectors) = reference(world, mode, slots)
    for step in range(STEPS):
        got = torch.cat([outs[step] for outs, _, _ in results])
        assert (got - ref_outs[step]).abs().max() <= TOL
        for rank, (_, sent, _) in enumerate(results):
            forward, backward = sent[step]
            want = expected_bytes(kind, mode, placement, scheme, world, step, rank, slots)
            assert (forward, forward + backward) == want, f"rank {rank} step {step}"
    keys = torch.cat([d[0] for _, _, d in results])
    vectors = torch.cat([d[1] for _, _, d in results])
    order = torch.argsort(keys)
    assert torch.equal(keys[order], ref_keys)  # every key on exactly one rank
    assert (vectors[order] - ref_vectors).abs().max() <= TOL


def uneven_batches_rank():
    layer = DistributedSlotSparseEmbeddingHash(8, DIM, 1, scheme="reduce_scatter")
    try:
        layer(*to_csr([[1]] * (dist.get_rank() + 1)))
    except ValueError as error:
        return str(error), layer.local.table.size
    return None, layer.local.table.size


def test_reduce_scatter_needs_even_batches_and_says_so_on_every_rank():
    for message, size in minidist.launch(uneven_batches_rank, 2):
        assert "same number of bags, got [1, 2]" in message and size == 0


def malformed_batch_rank():
    layer = DistributedSlotSparseEmbeddingHash(8, DIM, 1, scheme="reduce_scatter")
    values, offsets = to_csr([[1], [2, 3]])
    if dist.get_rank() == 1:
        offsets = torch.tensor([0, 2, 1])  # decreasing
    try:
        layer(values, offsets)
    except ValueError as error:
        return str(error), layer.local.table.size
    return None, layer.local.table.size


def test_a_malformed_batch_on_one_rank_is_an_error_on_every_rank():
    (first, size0), (second, size1) = minidist.launch(malformed_batch_rank, 2)
    assert "rank(s) [1] brought a malformed batch" in first
    assert "row_offsets must never decrease" in second and size0 == size1 == 0


def test_the_default_scheme_is_hugectrs_reduce_scatter():
    assert DistributedSlotSparseEmbeddingHash(8, DIM, 2).scheme == "reduce_scatter"


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="placement='range'"):
        DistributedSlotSparseEmbeddingHash(8, 2, 2, placement="range")
    with pytest.raises(ValueError, match="scheme='ring'"):
        DistributedSlotSparseEmbeddingHash(8, 2, 2, scheme="ring")
    with pytest.raises(ValueError, match="slots=0"):
        LocalizedSlotSparseEmbeddingHash(8, 2, 0)
    with pytest.raises(ValueError, match="placement='x'"):
        key_owner(torch.tensor([1]), 2, "x")
    assert key_owner(torch.tensor([-3, 4]), 4).tolist() == [1, 0]  # non-negative owners
