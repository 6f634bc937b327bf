"""Synthetic Criteo-like click data, generated from a seed (nothing is downloaded).

The Criteo display-advertising data sets (Criteo Labs, Kaggle 2014 and Terabyte 2015) that
Wide&Deep-, DeepFM- and DLRM-style models are benchmarked on have, per sample, 13 integer
("dense") features, 26 categorical slots of hashed ids and a 0/1 click. `criteo_data` builds a
small data set of that shape with a label a model can learn:

- dense: 13 float32 features, log(1 + count) of Poisson counts, as DLRM preprocesses them;
- sparse: 26 slots of int64 keys, the i-th most popular id of slot s drawn with probability
  ∝ 1/(i+1)^alpha (Zipf), vocabularies from 4 to a few thousand ids; slots 0..19 one key per
  sample (as in Criteo), slots 20..25 one to three keys (multi-hot bags);
- keys distinct per slot (HugeCTR's convention when slots share a table): slot s's key is
  `s·2^40 + id`, negated on every third slot, and slot 7 lives just below 2^62;
- label: Bernoulli(sigmoid(logit)) of a hidden logistic model, logit = dense·v +
  Σ_slots (mean over the bag of a per-key weight w(key)), w a function of the key's bits,
  shifted so that its mean over the data set is `BIAS`.

The batches come in HugeCTR's CSR form, sample-major (bag b = sample b // 26, slot b % 26),
see `layers.to_csr`. The same seed gives the same data.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .hash_table import fmix64

DENSE, SLOTS, ONE_HOT = 13, 26, 20
LARGE_SLOT = 7
BIAS = -1.0


def vocab_sizes(slots: int = SLOTS, largest: int = 2000) -> list[int]:
    """Slot s's number of ids: 4 up to `largest`, geometric, as Criteo's range from a few to
    millions (shrunk)."""
    ratio = (largest / 4) ** (1 / max(1, slots - 1))
    return [int(round(4 * ratio**s)) for s in range(slots)]


def slot_keys(slot: int, ids: torch.Tensor) -> torch.Tensor:
    """The int64 key of id `ids` in `slot` (distinct across slots, some negative or large)."""
    if slot == LARGE_SLOT:
        return (1 << 62) - 1 - ids
    key = (slot << 40) + ids
    return -key - 1 if slot % 3 == 2 else key


def hidden_weight(keys: torch.Tensor, scale: float = 1.2) -> torch.Tensor:
    """The hidden model's weight of each key, uniform in [-scale, scale) from fmix64 bits."""
    bits = fmix64(keys ^ 0x5BD1E995)
    unit = ((bits >> 11) & ((1 << 52) - 1)).to(torch.float64) / float(1 << 52)
    return (2 * unit - 1) * scale


@dataclass
class CriteoData:
    """dense [n, 13] float32, CSR (values, row_offsets) of n·slots bags, labels [n] 0/1."""

    dense: torch.Tensor
    values: torch.Tensor
    row_offsets: torch.Tensor
    labels: torch.Tensor
    slots: int

    @property
    def samples(self) -> int:
        return self.labels.numel()

    def batch(self, lo: int, hi: int):
        """Samples [lo, hi): (dense, values, row_offsets, labels), offsets starting at 0."""
        if not 0 <= lo <= hi <= self.samples:
            raise ValueError(f"batch: need 0 <= lo={lo} <= hi={hi} <= samples={self.samples}")
        offsets = self.row_offsets[lo * self.slots : hi * self.slots + 1]
        values = self.values[int(offsets[0]) : int(offsets[-1])]
        return self.dense[lo:hi], values, offsets - offsets[0], self.labels[lo:hi]

    def steps(self, global_batch: int) -> int:
        return self.samples // global_batch


def criteo_data(
    seed: int = 0,
    samples: int = 1024,
    slots: int = SLOTS,
    alpha: float = 1.1,
    largest_vocab: int = 2000,
) -> CriteoData:
    """The synthetic data set; the same for the same arguments."""
    if not 1 <= slots <= SLOTS:
        raise ValueError(f"criteo_data: slots={slots} must be in 1..{SLOTS}")
    if samples < 1:
        raise ValueError(f"criteo_data: samples={samples} must be >= 1")
    g = torch.Generator().manual_seed(seed)
    counts = torch.poisson(torch.full((samples, DENSE), 3.0, device="cpu"), generator=g)
    dense = torch.log1p(counts * torch.rand(samples, DENSE, device="cpu", generator=g) * 4)
    v = torch.randn(DENSE, device="cpu", generator=g, dtype=torch.float64) * 0.3
    logit = dense.double() @ v
    lengths = torch.ones(samples, slots, dtype=torch.int64, device="cpu")
    multi = slots - min(slots, ONE_HOT)
    if multi:
        lengths[:, ONE_HOT:] = torch.randint(1, 4, (samples, multi), device="cpu", generator=g)
    per_slot = []
    for s, vocab in enumerate(vocab_sizes(slots, largest_vocab)):
        popularity = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64, device="cpu") ** alpha
        n = int(lengths[:, s].sum())
        keys = slot_keys(s, torch.multinomial(popularity, n, True, generator=g))
        bag = torch.repeat_interleave(torch.arange(samples, device="cpu"), lengths[:, s])
        w = torch.zeros(samples, dtype=torch.float64, device="cpu").index_add_(
            0, bag, hidden_weight(keys)
        )
        logit += w / lengths[:, s]
        per_slot.append(keys)
    logit += BIAS - logit.mean()  # about a third of the samples are clicks
    labels = (
        torch.rand(samples, device="cpu", generator=g, dtype=torch.float64) < logit.sigmoid()
    ).float()
    # Interleave the slots sample-major: bag b = sample b // slots, slot b % slots.
    flat_lengths = lengths.reshape(-1)
    row_offsets = torch.zeros(flat_lengths.numel() + 1, dtype=torch.int64, device="cpu")
    row_offsets[1:] = torch.cumsum(flat_lengths, 0)
    values = torch.empty(int(row_offsets[-1]), dtype=torch.int64, device="cpu")
    for s, keys in enumerate(per_slot):
        starts = row_offsets[:-1].view(samples, slots)[:, s]
        within = torch.arange(keys.numel(), device="cpu") - torch.repeat_interleave(
            torch.cumsum(lengths[:, s], 0) - lengths[:, s], lengths[:, s]
        )
        values[torch.repeat_interleave(starts, lengths[:, s]) + within] = keys
    return CriteoData(dense.float(), values, row_offsets, labels, slots)
