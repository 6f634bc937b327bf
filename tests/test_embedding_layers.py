"""Hash embedding bags and sparse optimizers against torch's EmbeddingBag and optimizers.

Tolerance: float32, the same products summed in a different order (atomics / index_add_
against torch's kernel), 1e-6 on outputs, gradients and parameters.
"""

import pytest
import torch
from torch import nn

from minidist.embedding.layers import (
    HashEmbeddingBag,
    SparseAdagrad,
    SparseSGD,
    check_csr,
    key_init,
    to_csr,
)

BACKENDS = ["triton", "torch"]
TOL = 1e-6
# Empty bags (first, middle, last), bags of one, a key repeated inside a bag, negative keys.
BAGS = [[], [5], [5, 5, -3], [], [1 << 40, -3, 7, 5], [-(1 << 63)], [9, 9, 9], []]


def torch_reference(layer: HashEmbeddingBag, values: torch.Tensor) -> nn.EmbeddingBag:
    """nn.EmbeddingBag over a copy of the layer's rows, fed the rows the table gives."""
    ref = nn.EmbeddingBag.from_pretrained(
        layer.weight.detach().clone(),
        freeze=False,
        mode=layer.mode,
        sparse=True,
        include_last_offset=True,
    )
    return ref


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_forward_and_backward_equal_torch_embedding_bag(backend, mode):
    values, offsets = to_csr(BAGS)
    layer = HashEmbeddingBag(16, 40, mode, backend=backend)  # D=40: a partial column block
    out = layer(values, offsets)
    rows = layer.table.find(values)
    ref = torch_reference(layer, values)
    expected = ref(rows, offsets)
    assert (out - expected).abs().max() <= TOL
    assert out[0].abs().max() == 0 and out[3].abs().max() == 0  # empty bags give zeros
    top = torch.randn_like(out)
    (out * top).sum().backward()
    (expected * top).sum().backward()
    assert layer.weight.grad.is_sparse
    assert (layer.weight.grad.to_dense() - ref.weight.grad.to_dense()).abs().max() <= TOL
    touched = layer.weight.grad.coalesce().indices()[0]
    assert sorted(touched.tolist()) == sorted(set(rows.tolist()))  # only the rows used


@pytest.mark.parametrize("backend", BACKENDS)
def test_eval_mode_missing_keys_contribute_zero(backend):
    layer = HashEmbeddingBag(8, 4, "mean", backend=backend)
    values, offsets = to_csr([[1, 2], [3]])
    trained = layer(values, offsets)
    layer.eval()
    values2, offsets2 = to_csr([[1, 2, 99], [77]])
    out = layer(values2, offsets2)
    assert layer.table.size == 3  # nothing inserted at evaluation
    assert torch.allclose(out[0], trained[0] * 2 / 3, atol=TOL)  # 99 counts, adds zero
    assert out[1].abs().max() == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("opt", ["sgd", "adagrad"])
@pytest.mark.filterwarnings("ignore:Sparse invariant checks")  # raised inside torch's Adagrad
def test_sparse_optimizers_equal_torch(backend, opt):
    layer = HashEmbeddingBag(32, 8, "sum", backend=backend)
    batches = [to_csr(BAGS), to_csr([[5, 11], [], [12, 13, 5]]), to_csr(BAGS[::-1])]
    rows = [layer.rows(v) for v, _ in batches]  # insert and initialise before copying
    ref = torch_reference(layer, batches[0][0])
    before = layer.weight.detach().clone()
    if opt == "sgd":
        ours, theirs = SparseSGD([layer.weight], lr=0.1), torch.optim.SGD([ref.weight], lr=0.1)
    else:
        ours = SparseAdagrad([layer.weight], lr=0.1, eps=1e-10)
        theirs = torch.optim.Adagrad([ref.weight], lr=0.1, eps=1e-10)
    for (values, offsets), r in zip(batches, rows):
        for model, optimizer, x in ((layer, ours, values), (ref, theirs, r)):
            optimizer.zero_grad()
            model(x, offsets).pow(2).sum().backward()
            optimizer.step()
    assert (layer.weight.detach() - ref.weight.detach()).abs().max() <= TOL
    used = torch.unique(torch.cat(rows))
    untouched = torch.ones(32, dtype=torch.bool)
    untouched[used] = False
    assert torch.equal(layer.weight.detach()[untouched], before[untouched])
    assert not torch.equal(layer.weight.detach()[used], before[used])


def test_dump_is_key_sorted_and_equal_across_back_ends():
    """Rows differ between back ends (claim order), the key -> vector map does not."""
    dumps = []
    for backend in BACKENDS:
        layer = HashEmbeddingBag(8, 3, backend=backend)
        optimizer = SparseSGD([layer.weight], lr=0.5)
        layer(*to_csr([[7, -2], [3, 7]])).sum().backward()
        optimizer.step()
        keys, vectors = layer.dump()
        assert keys.tolist() == [-2, 3, 7]
        assert torch.equal(vectors, layer.weight.detach()[layer.table.find(keys)])
        dumps.append((keys, vectors))
    assert torch.equal(dumps[0][0], dumps[1][0])
    assert (dumps[0][1] - dumps[1][1]).abs().max() <= TOL
    assert key_init(torch.tensor([7, 7, 8]), 3).unique(dim=0).shape == (2, 3)


def test_bad_input_is_named_before_any_change():
    layer = HashEmbeddingBag(4, 2)
    values = torch.tensor([1, 2, 3], dtype=torch.int64)
    with pytest.raises(TypeError, match="values must be an int64 tensor"):
        layer(values.int(), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="never decrease"):
        layer(values, torch.tensor([0, 2, 1, 3]))
    with pytest.raises(ValueError, match=r"end at len\(values\)=3, got 2"):
        layer(values, torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="mode='max'"):
        HashEmbeddingBag(4, 2, "max")
    with pytest.raises(ValueError, match="dim=0"):
        HashEmbeddingBag(4, 0)
    assert layer.table.size == 0
    check_csr(torch.empty(0, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), "ok")
