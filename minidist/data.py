"""Deterministic synthetic data: nothing is downloaded, everything is made from a seed.

- `regression_batches`: inputs and targets of a fixed random teacher network, for the MLP.
- `make_corpus`: a small text-like corpus from a toy grammar (subjects, verbs, objects,
  punctuation), so the GPT has real structure to learn; `CharTokenizer` maps it to ids.
- `shard_batch`: the slice of a global batch one data-parallel rank trains on.
"""

from __future__ import annotations

import torch

from .runtime.device import rank_device

_SUBJECTS = "the cat|a dog|my friend|the model|every rank|the teacher|a student|the gpu".split("|")
_VERBS = "sees|sends|reduces|gathers|shards|trains|likes|waits for|computes".split("|")
_OBJECTS = "the gradient|a bucket|the loss|its shard|the batch|a tensor|the ring|the pipeline"
_OBJECTS = _OBJECTS.split("|")
_ENDINGS = [".", ".", ".", "!", "?", " today.", " again."]


def regression_batches(
    steps: int, batch_size: int, in_dim: int, out_dim: int, seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`steps` global batches (x, y) with y = teacher(x) + noise; the same for every seed."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(in_dim, out_dim, device="cpu", generator=g) / in_dim**0.5
    batches = []
    for _ in range(steps):
        x = torch.randn(batch_size, in_dim, device="cpu", generator=g)
        y = torch.tanh(x @ teacher) + 0.01 * torch.randn(
            batch_size, out_dim, device="cpu", generator=g
        )
        batches.append((x, y))
    return batches


def make_corpus(n_sentences: int = 400, seed: int = 0) -> str:
    """A text-like corpus of simple sentences from a toy grammar."""
    g = torch.Generator().manual_seed(seed)

    def pick(options: list[str]) -> str:
        return options[int(torch.randint(len(options), (1,), device="cpu", generator=g))]

    sentences = []
    for _ in range(n_sentences):
        s = f"{pick(_SUBJECTS)} {pick(_VERBS)} {pick(_OBJECTS)}{pick(_ENDINGS)}"
        sentences.append(s[0].upper() + s[1:])
    return " ".join(sentences)


class CharTokenizer:
    """Characters to ids and back; the vocabulary is the sorted set of the corpus' chars."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([self.index[c] for c in text], dtype=torch.long, device="cpu")

    def decode(self, ids: torch.Tensor) -> str:
        return "".join(self.chars[i] for i in ids.tolist())


def lm_batches(
    ids: torch.Tensor, steps: int, batch_size: int, seq_len: int, seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`steps` batches of (input, next-token target) windows cut at random offsets."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        starts = torch.randint(len(ids) - seq_len - 1, (batch_size,), device="cpu", generator=g)
        x = torch.stack([ids[s : s + seq_len] for s in starts.tolist()])
        y = torch.stack([ids[s + 1 : s + seq_len + 1] for s in starts.tolist()])
        batches.append((x, y))
    return batches


def shard_batch(batch: tuple[torch.Tensor, ...], rank: int, world_size: int) -> tuple:
    """Rank `rank`'s contiguous slice of every tensor in a global batch (split on dim 0), on
    this rank's device (`minidist.rank_device()`: its GPU under NCCL, else the CPU)."""
    size = batch[0].shape[0]
    if size % world_size:
        raise ValueError(
            f"shard_batch: global batch size {size} must be divisible by world_size={world_size}"
        )
    per = size // world_size
    device = rank_device()
    return tuple(t[rank * per : (rank + 1) * per].to(device) for t in batch)
