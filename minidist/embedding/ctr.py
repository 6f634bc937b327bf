"""Two CTR models on hash embeddings: Wide&Deep and DLRM, with a data-parallel dense part.

- Wide&Deep (Cheng et al. 2016, "Wide & Deep Learning for Recommender Systems", DLRS,
  section 3): logit = wide + deep. The wide part is linear: a weight per key (an embedding
  of dimension 1, summed over every slot) plus a linear layer on the dense features. The deep
  part concatenates the dense features and every slot's pooled vector and feeds an MLP.
- DLRM (Naumov et al. 2019, "Deep Learning Recommendation Model for Personalization and
  Recommendation Systems", section 2-3): a bottom MLP maps the dense features to a vector of
  the embedding dimension; the dot products of every pair among it and the slots' vectors
  (the "dot" interaction, upper triangle) and the bottom vector feed the top MLP.

Each model is `CTRModel(embeddings, dense)`: `embeddings` maps a name to a layer taking
HugeCTR's CSR batch (`HashEmbeddingBag`, the model-parallel `DistributedSlotSparseEmbedding
Hash` / `LocalizedSlotSparseEmbeddingHash`, or `DenseEmbeddingBag`, the torch baseline:
`nn.EmbeddingBag` over keys mapped to rows beforehand by a table of the training keys), and
`dense` is the MLP part, wrapped in minidist's DDP (`BucketedDataParallel`) on a world.
Embeddings use the sum combiner; a key missing at evaluation contributes zero.

Training (`train_steps`): mean logistic loss, `SparseAdagrad` on the embedding tables (torch's
`Adagrad` on the baseline's sparse gradient: the same update) and Adam on the dense part. On a
world of N ranks each rank takes its 1/N of every global batch; the dense gradients are
averaged by DDP and the pooled vectors' gradients divided by N (a hook), so that every
parameter gets the gradient of the global batch's mean loss, as in one process.

`auc` is the exact area under the ROC curve from ranks (Mann-Whitney U, ties counted half).
Not done here: HugeCTR's hybrid embedding, mixed precision, feature crosses of the wide part.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .hash_table import HashTable
from .layers import HashEmbeddingBag, SparseAdagrad, key_init

MODELS = ("wide_deep", "dlrm")
EMBEDDINGS = ("hash", "dense", "distributed", "localized")
SPARSE_LR, DENSE_LR, ADAGRAD_INIT = 0.3, 1e-2, 0.1


def mlp(sizes: list[int], last_relu: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class WideDeepDense(nn.Module):
    """Wide&Deep's dense part: the wide linear layer on the dense features, the deep MLP."""

    def __init__(self, dense: int, slots: int, dim: int, hidden: tuple[int, ...]):
        super().__init__()
        self.wide = nn.Linear(dense, 1)
        self.deep = mlp([dense + slots * dim, *hidden, 1])

    def forward(self, dense_x, deep, wide):
        deep_logit = self.deep(torch.cat([dense_x, deep.flatten(1)], 1))
        return (self.wide(dense_x) + wide.flatten(1).sum(1, keepdim=True) + deep_logit).squeeze(1)


class DLRMDense(nn.Module):
    """DLRM's dense part: bottom MLP, pairwise dot products, top MLP."""

    def __init__(self, dense: int, slots: int, dim: int, hidden: tuple[int, ...]):
        super().__init__()
        self.bottom = mlp([dense, *hidden, dim], last_relu=True)
        pairs = (slots + 1) * slots // 2
        self.top = mlp([dim + pairs, *hidden, 1])
        self.register_buffer("upper", torch.triu_indices(slots + 1, slots + 1, offset=1))

    def forward(self, dense_x, deep):
        x = self.bottom(dense_x)
        t = torch.cat([x[:, None], deep], 1)  # [batch, slots + 1, dim]
        z = torch.bmm(t, t.transpose(1, 2))[:, self.upper[0], self.upper[1]]
        return self.top(torch.cat([x, z], 1)).squeeze(1)


class DenseEmbeddingBag(nn.Module):
    """The torch baseline: `nn.EmbeddingBag(sparse=True)` over rows from a fixed key -> row
    map (a `HashTable` of `keys`), row r starting at `key_init(key)`. A key outside the map
    goes to a last, zero padding row (it contributes zero, as a missing key of the hash
    layer at evaluation)."""

    def __init__(self, keys: torch.Tensor, dim: int, init_scale: float = 0.05):
        super().__init__()
        keys = keys.unique()
        self.table = HashTable(max(1, keys.numel()))
        rows = self.table.insert(keys)
        self.bag = nn.EmbeddingBag(
            keys.numel() + 1, dim, mode="sum", sparse=True, padding_idx=keys.numel()
        )
        with torch.no_grad():
            self.bag.weight.zero_()
            self.bag.weight[rows] = key_init(keys, dim, init_scale)
        self.weight = self.bag.weight

    def forward(self, values: torch.Tensor, row_offsets: torch.Tensor) -> torch.Tensor:
        rows = self.table.find(values)
        rows = torch.where(rows < 0, self.bag.padding_idx, rows)
        return self.bag(rows, row_offsets[:-1], per_sample_weights=None)

    def dump(self) -> tuple[torch.Tensor, torch.Tensor]:
        keys, rows = self.table.items()
        return keys, self.weight.detach()[rows]


class CTRModel(nn.Module):
    """`embeddings` (name -> CSR layer) then `dense(dense_x, **{name: [batch, slots, dim]})`."""

    def __init__(self, embeddings: dict[str, nn.Module], dims: dict[str, int], dense, slots: int):
        super().__init__()
        self.embeddings = nn.ModuleDict(embeddings)
        self.dims, self.dense, self.slots = dims, dense, slots
        self.grad_divisor = 1.0  # the world size when the embeddings are model-parallel

    def forward(self, dense_x, values, row_offsets) -> torch.Tensor:
        pooled = {}
        for name, layer in self.embeddings.items():
            out = layer(values, row_offsets).view(-1, self.slots, self.dims[name])
            if self.grad_divisor != 1.0 and out.requires_grad:
                out.register_hook(lambda g, n=self.grad_divisor: g / n)
            pooled[name] = out
        return self.dense(dense_x, **pooled)

    def sparse_weights(self) -> list[nn.Parameter]:
        """The embedding tables (this rank's share of them on a world)."""
        return [getattr(layer, "local", layer).weight for layer in self.embeddings.values()]

    def dumps(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Each embedding as key-sorted (keys, vectors) (this rank's keys on a world)."""
        return {name: layer.dump() for name, layer in self.embeddings.items()}


def _embedding(kind, dim, slots, capacity, keys, placement, scheme):
    from .distributed import DistributedSlotSparseEmbeddingHash, LocalizedSlotSparseEmbeddingHash

    if kind == "hash":
        return HashEmbeddingBag(capacity, dim, "sum")
    if kind == "dense":
        if keys is None:
            raise ValueError("build_ctr: embedding='dense' needs keys= (the training keys)")
        return DenseEmbeddingBag(keys, dim)
    if kind == "distributed":
        return DistributedSlotSparseEmbeddingHash(
            capacity, dim, slots, placement=placement, scheme=scheme
        )
    return LocalizedSlotSparseEmbeddingHash(capacity, dim, slots)


def build_ctr(
    model: str,
    embedding: str = "hash",
    *,
    slots: int,
    dense: int,
    dim: int = 8,
    hidden: tuple[int, ...] = (32, 16),
    capacity: int = 1 << 14,
    keys=None,
    placement: str = "hashed",
    scheme: str = "reduce_scatter",
    seed: int = 0,
) -> CTRModel:
    """Wide&Deep or DLRM; `capacity` is per rank for the model-parallel embeddings
    (`placement` and `scheme` of the distributed slots, HugeCTR's reduce-scatter unless
    `scheme="all_to_all"`). The dense part is initialised from
    `seed`, the same for every embedding kind and world."""
    if model not in MODELS:
        raise ValueError(f"build_ctr: model={model!r} must be one of {MODELS}")
    if embedding not in EMBEDDINGS:
        raise ValueError(f"build_ctr: embedding={embedding!r} must be one of {EMBEDDINGS}")
    torch.manual_seed(seed)
    dense_cls = WideDeepDense if model == "wide_deep" else DLRMDense
    dense_part = dense_cls(dense, slots, dim, hidden)
    dims = {"deep": dim, "wide": 1} if model == "wide_deep" else {"deep": dim}
    layers = {
        n: _embedding(embedding, d, slots, capacity, keys, placement, scheme)
        for n, d in dims.items()
    }
    return CTRModel(layers, dims, dense_part, slots)


def make_optimizers(model: CTRModel, sparse_lr: float = SPARSE_LR, dense_lr: float = DENSE_LR):
    """(sparse, dense): SparseAdagrad on the hash tables (torch.optim.Adagrad on the
    baseline's sparse gradient), Adam on the dense part. The Adagrad accumulators start at
    `ADAGRAD_INIT` (TensorFlow's default, 0.1), so that a row's first update is smooth in its
    gradient rather than lr·sign(g), which would turn rounding in a tiny gradient into a
    whole step."""
    tables = model.sparse_weights()
    acc = dict(lr=sparse_lr, initial_accumulator_value=ADAGRAD_INIT)
    if any(isinstance(layer, DenseEmbeddingBag) for layer in model.embeddings.values()):
        sparse = torch.optim.Adagrad(tables, **acc)
    else:
        sparse = SparseAdagrad(tables, **acc)
    return sparse, torch.optim.Adam(model.dense.parameters(), lr=dense_lr)


def train_steps(
    model: CTRModel,
    optimizers,
    data,
    steps: int,
    global_batch: int,
    rank: int = 0,
    world: int = 1,
    first_step: int = 0,
) -> list[float]:
    """`steps` steps on global batches `first_step`, ...; rank takes its 1/world of each.
    Returns this rank's mean loss per step (the mean over ranks is the global batch's)."""
    if global_batch % world:
        raise ValueError(f"train_steps: global_batch={global_batch} must divide by world={world}")
    local = global_batch // world
    model.train()
    losses = []
    for step in range(first_step, first_step + steps):
        lo = step * global_batch + rank * local
        dense_x, values, offsets, labels = data.batch(lo, lo + local)
        loss = F.binary_cross_entropy_with_logits(model(dense_x, values, offsets), labels)
        for opt in optimizers:
            opt.zero_grad()
        loss.backward()
        if hasattr(model.dense, "finish_gradient_sync"):
            model.dense.finish_gradient_sync()
        for opt in optimizers:
            opt.step()
        losses.append(float(loss.detach()))
    return losses


@torch.no_grad()
def predict(model: CTRModel, data, lo: int, hi: int) -> torch.Tensor:
    """Logits of samples [lo, hi) in evaluation mode (missing keys contribute zero)."""
    model.eval()
    dense_x, values, offsets, _ = data.batch(lo, hi)
    out = model(dense_x, values, offsets)
    model.train()
    return out


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Exact ROC AUC: (sum of the positives' ranks - P(P+1)/2) / (P·Q), ties given their mean
    rank (the Mann-Whitney U statistic; a tie between a positive and a negative counts 1/2)."""
    scores, labels = scores.reshape(-1).double(), labels.reshape(-1)
    if scores.numel() != labels.numel():
        raise ValueError(f"auc: {scores.numel()} scores but {labels.numel()} labels")
    positive = labels > 0.5
    p, q = int(positive.sum()), int((~positive).sum())
    if p == 0 or q == 0:
        raise ValueError(f"auc: labels need both classes, got {p} positive and {q} negative")
    sorted_scores, order = torch.sort(scores)
    _, inverse, counts = torch.unique_consecutive(
        sorted_scores, return_inverse=True, return_counts=True
    )
    first = torch.cumsum(counts, 0) - counts + 1  # 1-based rank of each group's first
    mean_rank = first.double() + (counts.double() - 1) / 2
    ranks = torch.empty_like(scores)
    ranks[order] = mean_rank[inverse]
    return float((ranks[positive].sum() - p * (p + 1) / 2) / (p * q))


def ctr_on_rank(
    model: str,
    embedding: str,
    data,
    steps: int,
    global_batch: int,
    eval_range: tuple[int, int],
    **sizes,
) -> dict:
    """What each rank of a world runs: `model` with model-parallel embeddings (`embedding`
    'distributed' or 'localized') and its dense part in `BucketedDataParallel`, trained
    `steps` steps; returns its losses, key-sorted dumps, the dense parameters, the logits of
    its share of `eval_range`, the bytes it sent in the last step (`sent`, ring model) and
    the bytes of its embedding tables and their optimizer state (`memory`)."""
    import torch.distributed as dist

    from .. import comm
    from ..data_parallel.bucketed import BucketedDataParallel
    from ..memory import optimizer_state_tensors, tensor_bytes

    rank, world = dist.get_rank(), dist.get_world_size()
    net = build_ctr(model, embedding, slots=data.slots, dense=data.dense.shape[1], **sizes)
    net.dense = BucketedDataParallel(net.dense)
    net.grad_divisor = float(world)
    opts = make_optimizers(net)
    losses = train_steps(net, opts, data, steps - 1, global_batch, rank, world)
    with comm.record() as ledger:
        losses += train_steps(net, opts, data, 1, global_batch, rank, world, steps - 1)
    memory = tensor_bytes(net.sparse_weights()) + tensor_bytes(optimizer_state_tensors(opts[0]))
    lo, hi = eval_range
    share = (hi - lo) // world
    logits = predict(net, data, lo + rank * share, lo + (rank + 1) * share)
    dense_params = {n: p.detach().clone() for n, p in net.dense.module.named_parameters()}
    return dict(
        losses=losses,
        dumps=net.dumps(),
        dense=dense_params,
        logits=logits,
        sent=ledger.total_ring_bytes(),
        memory=memory,
    )


def merge_dumps(dumps: list[tuple[torch.Tensor, torch.Tensor]]):
    """The union of the ranks' key-sorted dumps, key-sorted."""
    keys = torch.cat([k for k, _ in dumps])
    vectors = torch.cat([v for _, v in dumps])
    order = torch.argsort(keys)
    return keys[order], vectors[order]


def dump_diff(a, b) -> float:
    """Largest |difference| of two key -> vector dumps (infinite if the keys differ)."""
    if not torch.equal(a[0], b[0]):
        return float("inf")
    return float((a[1] - b[1]).abs().max()) if a[1].numel() else 0.0
