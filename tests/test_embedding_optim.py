"""The sparse optimizers (minidist/embedding/optim.py) step for step against torch's.

Three steps over batches with a key repeated inside a bag, empty bags, and keys missing
from a step then coming back. The references run on a copy of the value table:
SGD, Adagrad, SparseAdam on `F.embedding_bag(sparse=True)`; SGD(momentum) and Adam
(global) on the dense gradient of the whole table; local momentum as torch's SGD over one
parameter per row, a row without a gradient skipped (grad None).
eps: Adagrad and SparseAdam add eps to the uncorrected root (torch's and HugeCTR's
convention), global Adam to the bias-corrected root (torch.optim.Adam's).
Tolerance: float32, the same operations in another order, 1e-6 on the whole table.
"""

import pytest
import torch
import torch.nn.functional as F

from minidist.embedding.layers import HashEmbeddingBag, to_csr
from minidist.embedding.optim import SparseAdagrad, SparseAdam, SparseSGD

TOL, LR, DIM = 1e-6, 0.05, 5
BATCHES = [
    [[5], [5, 5, -3], [], [1 << 40, -3, 7]],
    [[11, 5], [], [12, 11], [5]],  # -3, 7, 1 << 40 missing
    [[-3, 7], [7, 7, 7], [12], [1 << 40]],  # they come back; 11 missing
]
KINDS = {
    "sgd": (lambda p: SparseSGD(p, lr=LR), lambda p: torch.optim.SGD(p, lr=LR), "sparse"),
    "momentum_global": (
        lambda p: SparseSGD(p, lr=LR, momentum=0.9, update="global"),
        lambda p: torch.optim.SGD(p, lr=LR, momentum=0.9),
        "dense",
    ),
    "momentum_local": (
        lambda p: SparseSGD(p, lr=LR, momentum=0.9, update="local"),
        lambda p: torch.optim.SGD(p, lr=LR, momentum=0.9),
        "per_row",
    ),
    "adagrad": (
        lambda p: SparseAdagrad(p, lr=LR, eps=1e-10),
        lambda p: torch.optim.Adagrad(p, lr=LR, eps=1e-10),
        "sparse",
    ),
    "adam_local": (
        lambda p: SparseAdam(p, lr=LR, eps=1e-8, update="local"),
        lambda p: torch.optim.SparseAdam(p, lr=LR, eps=1e-8),
        "sparse",
    ),
    "adam_global": (
        lambda p: SparseAdam(p, lr=LR, eps=1e-8, update="global"),
        lambda p: torch.optim.Adam(p, lr=LR, eps=1e-8),
        "dense",
    ),
}


def top_grad(step: int, bags: int) -> torch.Tensor:
    return torch.randn(bags, DIM, generator=torch.Generator().manual_seed(step))


def loss_of(out: torch.Tensor, step: int) -> torch.Tensor:
    return (out * top_grad(step, out.shape[0])).sum() + out.pow(2).sum()


def run_ours(kind: str, mode: str, loss_scale: float = 1.0):
    layer = HashEmbeddingBag(16, DIM, mode, loss_scale=loss_scale)
    for bags in BATCHES:  # insert and initialise every key first: fixed rows
        layer.rows(to_csr(bags)[0])
    start = layer.weight.detach().clone()
    optimizer = KINDS[kind][0]([layer.weight])
    tables = []
    for step, bags in enumerate(BATCHES):
        optimizer.zero_grad()
        (loss_of(layer(*to_csr(bags)), step) * loss_scale).backward()
        optimizer.step()
        tables.append(layer.weight.detach().clone())
    return layer, start, tables


def run_torch(kind: str, mode: str, layer: HashEmbeddingBag, start: torch.Tensor):
    how = KINDS[kind][2]
    if how == "per_row":
        params = [torch.nn.Parameter(row.clone()) for row in start]
    else:
        params = [torch.nn.Parameter(start.clone())]
    optimizer = KINDS[kind][1](params)
    tables = []
    for step, bags in enumerate(BATCHES):
        values, offsets = to_csr(bags)
        rows = layer.table.find(values)
        weight = torch.stack(list(params)) if how == "per_row" else params[0]
        out = F.embedding_bag(
            rows, weight, offsets, mode=mode, include_last_offset=True, sparse=how == "sparse"
        )
        optimizer.zero_grad()
        loss_of(out, step).backward()
        if how == "per_row":
            for r, p in enumerate(params):
                if r not in rows.tolist():
                    p.grad = None  # an untouched row: torch's optimizer skips it
        optimizer.step()
        tables.append(
            torch.stack([p.detach() for p in params])
            if how == "per_row"
            else params[0].detach().clone()
        )
    return tables


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.filterwarnings("ignore:Sparse invariant checks")  # raised inside torch's Adagrad
def test_steps_equal_torch(kind, mode):
    layer, start, ours = run_ours(kind, mode)
    theirs = run_torch(kind, mode, layer, start)
    for step, (a, b) in enumerate(zip(ours, theirs)):
        assert (a - b).abs().max() <= TOL, f"step {step}"
    unused = layer.table.size  # rows past the keys are never touched
    assert torch.equal(ours[-1][unused:], start[unused:])
    row7 = layer.table.find(torch.tensor([7]))  # 7 is missing from step 1
    moved_when_absent = not torch.equal(ours[1][row7], ours[0][row7])
    assert moved_when_absent == (kind in ("momentum_global", "adam_global"))


def test_loss_scale_gives_the_same_update():
    _, _, plain = run_ours("adam_global", "mean")
    _, _, scaled = run_ours("adam_global", "mean", loss_scale=1024.0)
    assert all(torch.equal(a, b) for a, b in zip(plain, scaled))  # a power of two: exact


def test_update_rows_equals_step():
    """`update_rows` on (unique rows, row grads) is what `step` does with the sparse grad."""
    a, b = (torch.nn.Parameter(torch.ones(6, 2)) for _ in range(2))
    rows, grads = torch.tensor([1, 4]), torch.tensor([[0.5, -1.0], [2.0, 0.25]])
    opt_a, opt_b = SparseAdam([a], lr=0.1), SparseAdam([b], lr=0.1)
    a.grad = torch.sparse_coo_tensor(rows[None], grads, (6, 2))
    opt_a.step()
    opt_b.update_rows(b, rows, grads)
    assert torch.equal(a, b) and opt_a.state[a]["step"] == opt_b.state[b]["step"] == 1
    # plain SGD takes repeated rows (the atomic path, no sort)
    c = torch.nn.Parameter(torch.zeros(3, 1))
    SparseSGD([c], lr=1.0).update_rows(c, torch.tensor([2, 2, 0]), torch.ones(3, 1))
    assert c.detach().flatten().tolist() == [-1.0, 0.0, -2.0]


def test_bad_arguments_are_named():
    p = [torch.nn.Parameter(torch.zeros(2, 2))]
    with pytest.raises(ValueError, match="lr=0"):
        SparseSGD(p, lr=0)
    with pytest.raises(ValueError, match="momentum=1"):
        SparseSGD(p, lr=0.1, momentum=1)
    with pytest.raises(ValueError, match="update='lazy'"):
        SparseAdam(p, update="lazy")
    with pytest.raises(ValueError, match="betas="):
        SparseAdam(p, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="eps=0"):
        SparseAdagrad(p, eps=0)


@pytest.mark.parametrize(
    "name, make",
    [
        ("sgd", lambda w: SparseSGD([w], lr=0.1)),
        ("momentum", lambda w: SparseSGD([w], lr=0.1, momentum=0.9)),
        ("adagrad", lambda w: SparseAdagrad([w], lr=0.1)),
        ("adam", lambda w: SparseAdam([w], lr=0.1)),
    ],
)
def test_state_bytes_per_rank_are_the_table_and_its_optimizer_state(name, make):
    """Measured after a step: the float32 value table plus each optimizer's tensors shaped
    like it (`theory.embedding_state_bytes_per_rank`)."""
    from minidist.embedding import theory
    from minidist.memory import optimizer_state_tensors, tensor_bytes

    capacity, dim = 32, 4
    layer = HashEmbeddingBag(capacity, dim)
    opt = make(layer.weight)
    values, offsets = to_csr([[1, 2], [3], [2, 5, 7]])
    layer(values, offsets).sum().backward()
    opt.step()
    measured = tensor_bytes([layer.weight]) + tensor_bytes(optimizer_state_tensors(opt))
    assert measured == theory.embedding_state_bytes_per_rank(capacity, dim, name)
