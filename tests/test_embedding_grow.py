"""`HashEmbeddingBag.grow` and `auto_grow`: a table that starts too small and grows while
training equals one that was large enough from the start, bitwise (key -> vector and the
optimizer's state by key), for each sparse optimizer; without `auto_grow` the overflow is an
error that names the capacity and the way out, raised before any change."""

import pytest
import torch

from minidist.embedding import checkpoint
from minidist.embedding.hash_table import HashTableFullError
from minidist.embedding.layers import HashEmbeddingBag, to_csr
from minidist.embedding.optim import SparseAdagrad, SparseAdam, SparseSGD

OPTIMIZERS = {
    "sgd": lambda p: SparseSGD(p, lr=0.1),
    "momentum_global": lambda p: SparseSGD(p, lr=0.1, momentum=0.9, update="global"),
    "adagrad": lambda p: SparseAdagrad(p, lr=0.1, initial_accumulator_value=0.1),
    "adam_global": lambda p: SparseAdam(p, lr=0.01, update="global"),
}
# 3, then 5 more, then 9 more keys: a table of 4 grows twice.
BATCHES = [[[1, 2], [3]], [[4, 5, 1], [6, 7, 8]], [[-(1 << 40)] + list(range(10, 18)), [2]]]


def train(layer, optimizer):
    for bags in BATCHES:
        out = layer(*to_csr(bags))
        optimizer.zero_grad()
        (out.pow(2).sum() + out.sum()).backward()
        optimizer.step()


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_growing_equals_a_table_large_enough(opt):
    small = HashEmbeddingBag(4, 3, auto_grow=True)
    small_opt = OPTIMIZERS[opt]([small.weight])
    train(small, small_opt)
    large = HashEmbeddingBag(64, 3)
    large_opt = OPTIMIZERS[opt]([large.weight])
    train(large, large_opt)
    assert small.table.capacity == 17 and small.weight.shape == (17, 3)  # 4, 8, max(2·8, 17)
    got = checkpoint.embedding_state_dict(small, small_opt)
    want = checkpoint.embedding_state_dict(large, large_opt)
    assert torch.equal(got["keys"], want["keys"]) and torch.equal(got["vectors"], want["vectors"])
    for name, rows in want["optimizer"].items():
        assert small_opt.state[small.weight][name].shape == small.weight.shape
        assert torch.equal(got["optimizer"][name], rows)


def test_without_auto_grow_the_overflow_is_named_before_any_change():
    layer = HashEmbeddingBag(4, 3)
    layer(*to_csr(BATCHES[0]))
    weight = layer.weight.detach().clone()
    with pytest.raises(HashTableFullError, match="capacity=4.*call grow"):
        layer(*to_csr(BATCHES[1]))
    assert layer.table.size == 3 and torch.equal(layer.weight.detach(), weight)
    with pytest.raises(ValueError, match="new_capacity=2"):
        layer.grow(2)
    assert layer.weight.shape == (4, 3)


def test_grow_keeps_rows_vectors_and_a_pending_gradient():
    layer = HashEmbeddingBag(4, 2)
    values, offsets = to_csr(BATCHES[0])
    layer(values, offsets).sum().backward()
    rows, grad = layer.table.find(values), layer.weight.grad.to_dense()
    before = layer.weight.detach().clone()
    layer.grow(10)
    assert torch.equal(layer.table.find(values), rows)
    assert torch.equal(layer.weight.detach()[:4], before) and layer.weight.shape == (10, 2)
    assert torch.equal(layer.weight.grad.to_dense()[:4], grad)
    assert layer.weight.grad.shape == (10, 2)
