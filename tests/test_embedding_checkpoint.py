"""Key-sorted save/load (minidist/embedding/checkpoint.py): train k steps, save, load into a
fresh layer and optimizer, continue; the result equals an uninterrupted run bitwise (every
computation is per row and per occurrence in input order, so the new row numbers do not
enter it). Also for the distributed layers on a world of 2, each rank its own shard.
"""

import pytest
import torch
import torch.distributed as dist

import minidist
from minidist.embedding import checkpoint
from minidist.embedding.distributed import (
    DistributedSlotSparseEmbeddingHash,
    LocalizedSlotSparseEmbeddingHash,
)
from minidist.embedding.layers import HashEmbeddingBag, to_csr
from minidist.embedding.optim import SparseAdagrad, SparseAdam, SparseSGD

STEPS, SAVE_AT, DIM, SLOTS = 4, 2, 3, 2
OPTIMIZERS = {
    "sgd": lambda p: SparseSGD(p, lr=0.1),
    "momentum_local": lambda p: SparseSGD(p, lr=0.1, momentum=0.9),
    "adagrad": lambda p: SparseAdagrad(p, lr=0.1),
    "adam_local": lambda p: SparseAdam(p, lr=0.01),
    "adam_global": lambda p: SparseAdam(p, lr=0.01, update="global"),
}


def batch(step: int, rank: int = 0):
    """Sample-major bags over SLOTS slots, new keys arriving at every step (slot s: keys
    s*1000 + id), so the loaded table's rows differ from the original's claim order."""
    g = torch.Generator().manual_seed(10 * step + rank)
    bags = []
    for _ in range(3):
        for s in range(SLOTS):
            n = int(torch.randint(0, 4, (1,), generator=g))
            bags.append(
                [s * 1000 + int(k) for k in torch.randint(-5, 6 + 3 * step, (n,), generator=g)]
            )
    return to_csr(bags)


def train(layer, optimizer, steps, rank: int = 0):
    for step in steps:
        out = layer(*batch(step, rank))
        optimizer.zero_grad()
        (out.pow(2).sum() + out.sum()).backward()
        optimizer.step()


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_resume_equals_an_uninterrupted_run(opt, tmp_path):
    whole = HashEmbeddingBag(64, DIM, "mean")
    whole_optimizer = OPTIMIZERS[opt]([whole.weight])
    train(whole, whole_optimizer, range(STEPS))

    first = HashEmbeddingBag(64, DIM, "mean")
    optimizer = OPTIMIZERS[opt]([first.weight])
    train(first, optimizer, range(SAVE_AT))
    checkpoint.save(first, optimizer, tmp_path)
    resumed = HashEmbeddingBag(64, DIM, "mean")
    optimizer = OPTIMIZERS[opt]([resumed.weight])
    checkpoint.load(resumed, optimizer, tmp_path)
    assert torch.equal(resumed.dump()[0], first.dump()[0])
    train(resumed, optimizer, range(SAVE_AT, STEPS))

    keys, vectors = resumed.dump()
    want_keys, want_vectors = whole.dump()
    assert torch.equal(keys, want_keys) and torch.equal(vectors, want_vectors)
    saved = checkpoint.embedding_state_dict(resumed, optimizer)
    want = checkpoint.embedding_state_dict(whole, whole_optimizer)  # the optimizer state too
    assert saved["optimizer"].keys() == want["optimizer"].keys()
    assert all(torch.equal(saved["optimizer"][k], want["optimizer"][k]) for k in want["optimizer"])
    assert saved["optimizer_other"] == want["optimizer_other"]


def distributed_rank(kind: str, directory: str):
    rank = dist.get_rank()

    def build():
        if kind == "localized":
            layer = LocalizedSlotSparseEmbeddingHash(64, DIM, SLOTS, "mean")
        else:
            layer = DistributedSlotSparseEmbeddingHash(64, DIM, SLOTS, "mean", scheme=kind)
        return layer, SparseAdam([layer.local.weight], lr=0.01, update="global")

    whole, optimizer = build()
    train(whole, optimizer, range(STEPS), rank)
    first, optimizer = build()
    train(first, optimizer, range(SAVE_AT), rank)
    checkpoint.save(first, optimizer, directory, rank)
    resumed, optimizer = build()
    checkpoint.load(resumed, optimizer, directory, rank)
    train(resumed, optimizer, range(SAVE_AT, STEPS), rank)
    return whole.dump(), resumed.dump()


@pytest.mark.parametrize("kind", ["reduce_scatter", "all_to_all", "localized"])
def test_each_rank_resumes_its_shard(kind, tmp_path):
    for (want_keys, want_vectors), (keys, vectors) in minidist.launch(
        distributed_rank, 2, kind, str(tmp_path)
    ):
        assert torch.equal(keys, want_keys) and torch.equal(vectors, want_vectors)


def test_bad_loads_are_named(tmp_path):
    layer = HashEmbeddingBag(32, DIM)
    optimizer = SparseAdagrad([layer.weight])
    train(layer, optimizer, range(1))
    state = checkpoint.embedding_state_dict(layer, optimizer)
    with pytest.raises(ValueError, match="already holds"):
        checkpoint.load_embedding_state_dict(layer, optimizer, state)
    other = HashEmbeddingBag(32, DIM + 1)
    with pytest.raises(ValueError, match="dim=3.*dim=4"):
        checkpoint.load_embedding_state_dict(other, None, state)
    plain = HashEmbeddingBag(32, DIM)
    with pytest.raises(ValueError, match=r"optimizer states \['sum'\].*has \[\]"):
        checkpoint.load_embedding_state_dict(plain, SparseSGD([plain.weight], lr=0.1), state)
    small = HashEmbeddingBag(2, DIM)
    with pytest.raises(RuntimeError, match="capacity=2"):
        checkpoint.load_embedding_state_dict(small, SparseAdagrad([small.weight]), state)
    assert small.table.size == 0
    with pytest.raises(FileNotFoundError, match="rank 3"):
        checkpoint.load(plain, None, tmp_path, rank=3)
