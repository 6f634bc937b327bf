"""Lesson 11's data and rank functions: a small synthetic click-through data set.

`ctr_data(seed, samples, ...)` builds, from a seed and nothing downloaded, what a
recommendation model reads (Criteo-like, much smaller): every sample has `slots` categorical
fields, each a bag of 1..3 int64 keys (slot 0 one-hot), drawn Zipf-like (the i-th most
popular id with probability ∝ 1/(i+1)^alpha) so a few keys are hot, and a 0/1 click label
from a hidden rule (the sign of a per-key score summed over the sample, plus noise). The keys
are structured as real ones often are: slot s's key is `SLOT_BASE[s] + SLOT_STRIDE[s]·id`,
slot 3 negative and slots 1 and 2 in steps of 2 and 4, so `key mod N` piles them on few
ranks while `fmix64(key) mod N` spreads them (notebook 11's load-imbalance plot).

`slot_embedding_on_rank` is what each rank of the tour row and of notebook 11 runs: the
distributed slot embedding for each placement (HugeCTR's reduce-scatter scheme unless
`scheme="all_to_all"`), trained a few steps with `SparseAdagrad` on a logistic loss, its
bytes recorded per step; `reference` trains one `HashEmbeddingBag` on the global batches the
same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import comm
from ..memory import optimizer_state_tensors, tensor_bytes
from .distributed import (
    DistributedSlotSparseEmbeddingHash,
    LocalizedSlotSparseEmbeddingHash,
    key_owner,
)
from .hash_table import fmix64
from .layers import HashEmbeddingBag, SparseAdagrad, to_csr

SLOTS, DIM, VOCAB, ALPHA = 4, 4, 64, 1.2
SLOT_BASE = (0, 1 << 20, 2 << 20, -(3 << 20))
SLOT_STRIDE = (1, 2, 4, 1)
LR = 0.05
# float32, the same products summed in another order (per-row gradient sums on the owners):
# 1e-6, as in tests/test_embedding_distributed.py
TOL = 1e-6


@dataclass
class CTRData:
    """bags: samples·slots key lists, sample-major (bag b = sample b // slots, slot b % slots);
    labels: [samples] float32 0/1."""

    bags: list[list[int]]
    labels: torch.Tensor
    slots: int

    @property
    def samples(self) -> int:
        return self.labels.numel()

    def batch(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Samples [lo, hi) as (values, row_offsets, labels), HugeCTR's CSR input."""
        values, offsets = to_csr(self.bags[lo * self.slots : hi * self.slots])
        return values, offsets, self.labels[lo:hi]

    def keys(self) -> torch.Tensor:
        """Every key occurrence, in order."""
        return torch.tensor([k for b in self.bags for k in b], dtype=torch.int64, device="cpu")


def slot_key(slot: int, ids: torch.Tensor) -> torch.Tensor:
    return SLOT_BASE[slot] + SLOT_STRIDE[slot] * ids


def ctr_data(
    seed: int = 0, samples: int = 64, slots: int = SLOTS, vocab: int = VOCAB, alpha: float = ALPHA
) -> CTRData:
    """The synthetic click-through data set; the same for the same arguments."""
    if slots > len(SLOT_BASE):
        raise ValueError(f"ctr_data: slots={slots} must be <= {len(SLOT_BASE)}")
    g = torch.Generator().manual_seed(seed)
    popularity = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64, device="cpu") ** alpha
    lengths = torch.randint(1, 4, (samples, slots), device="cpu", generator=g)
    lengths[:, 0] = 1  # slot 0 is one-hot
    bags: list[list[int]] = []
    scores = torch.zeros(samples, dtype=torch.float64, device="cpu")
    for i in range(samples):
        for s in range(slots):
            ids = torch.multinomial(popularity, int(lengths[i, s]), True, generator=g)
            keys = slot_key(s, ids)
            # the hidden rule: each key votes -1, 0 or +1 (from its hash), summed over the sample
            scores[i] += float(((fmix64(keys) & 3) - 1.5).sign().sum())
            bags.append(keys.tolist())
    noise = torch.randn(samples, device="cpu", generator=g, dtype=torch.float64)
    labels = (scores + noise > 0).to(torch.float32)
    return CTRData(bags, labels, slots)


def _loss(pooled: torch.Tensor, labels: torch.Tensor, slots: int, global_batch: int):
    """Logistic loss of logit = the sum of a sample's pooled vectors, mean over the global
    batch (a rank sums its samples and divides by the global batch)."""
    logits = pooled.view(-1, slots * pooled.shape[1]).sum(1)
    return F.binary_cross_entropy_with_logits(logits, labels, reduction="sum") / global_batch


def rank_range(step: int, rank: int, world: int, global_batch: int) -> tuple[int, int]:
    local = global_batch // world
    lo = step * global_batch + rank * local
    return lo, lo + local


def split_counts(data: CTRData, step: int, world: int, global_batch: int, placement: str):
    """keys_to[r][q]: key occurrences rank r sends to owner q at `step` (theory's input)."""
    owners = [
        key_owner(data.batch(*rank_range(step, r, world, global_batch))[0], world, placement)
        for r in range(world)
    ]
    return [torch.bincount(o, minlength=world).tolist() for o in owners]


def localized_counts(data: CTRData, step: int, world: int, global_batch: int):
    """(bags_to, keys_to): bags_to[r][q] bags of rank r's batch at `step` whose slot lives
    on rank q (slot s on s mod N), keys_to[r][q] the keys in them."""
    bags_to, keys_to = [], []
    for r in range(world):
        lo, hi = rank_range(step, r, world, global_batch)
        bags, keys = [0] * world, [0] * world
        for b in range(lo * data.slots, hi * data.slots):
            q = (b % data.slots) % world
            bags[q] += 1
            keys[q] += len(data.bags[b])
        bags_to.append(bags)
        keys_to.append(keys)
    return bags_to, keys_to


def slot_embedding_on_rank(
    data: CTRData,
    placements: tuple[str, ...],
    steps: int,
    global_batch: int,
    capacity_per_rank: int,
    dim: int = DIM,
    scheme: str = "reduce_scatter",
    mode: str = "sum",
) -> dict:
    """Each placement of `DistributedSlotSparseEmbeddingHash` (`scheme`, combiner `mode`),
    trained `steps` steps; the placement "localized" is `LocalizedSlotSparseEmbeddingHash`
    (slot s whole on rank s mod N) instead."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for placement in placements:
        if placement == "localized":
            layer = LocalizedSlotSparseEmbeddingHash(capacity_per_rank, dim, data.slots, mode)
        else:
            layer = DistributedSlotSparseEmbeddingHash(
                capacity_per_rank, dim, data.slots, mode, placement=placement, scheme=scheme
            )
        opt = SparseAdagrad([layer.local.weight], lr=LR)
        pooled_steps, sent = [], []
        for step in range(steps):
            batch = data.batch(*rank_range(step, rank, world, global_batch))
            values, offsets, labels = (t.to(layer.local.weight.device) for t in batch)
            with comm.record() as ledger:
                pooled = layer(values, offsets)
                opt.zero_grad()
                _loss(pooled, labels, data.slots, global_batch).backward()
            opt.step()
            sent.append(ledger.total_ring_bytes())
            pooled_steps.append(pooled.detach())
        weight = layer.local.weight
        out[placement] = dict(
            pooled=pooled_steps,
            sent=sent,
            dump=layer.dump(),
            keys=layer.local.table.size,
            memory=tensor_bytes([weight]) + tensor_bytes(optimizer_state_tensors(opt)),
        )
    return out


def reference(
    data: CTRData, steps: int, global_batch: int, capacity: int, dim: int = DIM, mode: str = "sum"
):
    """One HashEmbeddingBag on the global batches: (pooled per step, key-sorted dump)."""
    layer = HashEmbeddingBag(capacity, dim, mode)
    opt = SparseAdagrad([layer.weight], lr=LR)
    pooled_steps = []
    for step in range(steps):
        values, offsets, labels = data.batch(step * global_batch, (step + 1) * global_batch)
        pooled = layer(values, offsets)
        opt.zero_grad()
        _loss(pooled, labels, data.slots, global_batch).backward()
        opt.step()
        pooled_steps.append(pooled.detach())
    return pooled_steps, layer.dump()


def max_diff_vs_reference(results: list[dict], placement: str, ref) -> float:
    """Largest |difference| of the pooled outputs and of the key-sorted key -> vector dumps
    (infinite when the ranks together hold other keys than the reference)."""
    ref_pooled, (ref_keys, ref_vectors) = ref
    diff = 0.0
    for step, want in enumerate(ref_pooled):
        got = torch.cat([r[placement]["pooled"][step] for r in results])
        diff = max(diff, float((got - want).abs().max()))
    keys = torch.cat([r[placement]["dump"][0] for r in results])
    vectors = torch.cat([r[placement]["dump"][1] for r in results])
    order = torch.argsort(keys)
    if not torch.equal(keys[order], ref_keys):
        return float("inf")
    return max(diff, float((vectors[order] - ref_vectors).abs().max()))
