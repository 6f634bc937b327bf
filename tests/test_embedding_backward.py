"""HugeCTR's sort/dedup backward (minidist/embedding/backward.py): the worked example, and
the per-row gradient against a dense torch reference (autograd through F.embedding_bag).

Tolerance: float32, the same products summed in another order, 1e-6; the loss scale is a
power of two, so dividing by it is exact and the scaled run equals the unscaled one bitwise.
"""

import pytest
import torch
import torch.nn.functional as F

from minidist.embedding.backward import (
    occurrence_bags,
    segment_sum_gradients,
    sort_and_dedup,
)
from minidist.embedding.layers import HashEmbeddingBag, to_csr

TOL = 1e-6
BACKENDS = ["triton", "torch"]


def test_the_worked_example():
    rows = torch.tensor([4, 5, 1, 2, 3, 5, 1, 3, 2, 1])
    order, unique_rows, run_offsets = sort_and_dedup(rows)
    assert rows[order].tolist() == [1, 1, 1, 2, 2, 3, 3, 4, 5, 5]
    assert run_offsets.tolist() == [0, 3, 5, 7, 8, 10]
    assert unique_rows.tolist() == [1, 2, 3, 4, 5]
    assert order.tolist() == [2, 6, 9, 3, 8, 4, 7, 0, 1, 5]  # stable: occurrence order kept
    assert occurrence_bags(torch.tensor([0, 2, 2, 5, 6])).tolist() == [0, 0, 2, 2, 2, 3]
    empty = sort_and_dedup(torch.empty(0, dtype=torch.int64))
    assert empty[1].numel() == 0 and empty[2].tolist() == [0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_segment_sum_equals_dense_autograd(backend, mode):
    g = torch.Generator().manual_seed(0)
    bags_list = [[4, 5, 1], [], [2, 3, 5, 1], [3], [2, 1, 1]]  # repeats, an empty bag
    rows, offsets = to_csr(bags_list)
    table = torch.randn(8, 6, generator=g, requires_grad=True)
    grad_pooled = torch.randn(len(bags_list), 6, generator=g)
    F.embedding_bag(rows, table, offsets, mode=mode, include_last_offset=True).backward(grad_pooled)
    bags = occurrence_bags(offsets)
    counts = (offsets[1:] - offsets[:-1])[bags].float()
    weights = torch.ones(rows.numel()) if mode == "sum" else 1 / counts
    unique_rows, row_grads = segment_sum_gradients(
        rows, bags, grad_pooled, weights, backend=backend
    )
    assert unique_rows.tolist() == [1, 2, 3, 4, 5]
    assert (row_grads - table.grad[unique_rows]).abs().max() <= TOL
    untouched = [0, 6, 7]
    assert table.grad[untouched].abs().max() == 0
    # missing keys (row -1) are skipped; the loss scale divides
    rows2 = torch.cat([rows, torch.tensor([-1])])
    bags2, weights2 = torch.cat([bags, torch.tensor([0])]), torch.cat([weights, torch.ones(1)])
    u2, g2 = segment_sum_gradients(rows2, bags2, grad_pooled * 8, weights2, 8.0, backend=backend)
    assert torch.equal(u2, unique_rows) and (g2 - row_grads).abs().max() <= TOL


@pytest.mark.parametrize("backend", BACKENDS)
def test_loss_scale_gives_the_same_gradient(backend):
    values, offsets = to_csr([[5, 5, -3], [], [7, 5]])
    grads = []
    for scale in (1.0, 1024.0):
        layer = HashEmbeddingBag(8, 4, "mean", backend=backend, loss_scale=scale)
        (layer(values, offsets).pow(2).sum() * scale).backward()
        grads.append(layer.weight.grad.to_dense())
    assert torch.equal(grads[0], grads[1])  # 1024 is a power of two: exact


def test_bad_arguments_are_named():
    one = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(ValueError, match="loss_scale=0"):
        segment_sum_gradients(one, one, torch.zeros(1, 2), torch.ones(1), 0)
    with pytest.raises(ValueError, match="one entry per occurrence"):
        segment_sum_gradients(one, one, torch.zeros(1, 2), torch.ones(2))
    with pytest.raises(ValueError, match="loss_scale=-1"):
        HashEmbeddingBag(4, 2, loss_scale=-1)
