"""Tensor-parallel layers, each made from the dense layer it splits (so they start equal).

Shoeybi et al. 2019, "Megatron-LM", section 3: an MLP is a column-parallel Linear (weight
split by output rows: each rank computes its slice of the hidden units, no communication)
followed by a row-parallel Linear (weight split by input columns: each rank's partial
output, summed by one all-reduce, g; the bias is added after the sum). Attention splits
the heads the same way: Q, K, V column-parallel by heads, the output projection
row-parallel; the attention's own forward then runs on this rank's heads (`model.py`). The
input of each region passes f, whose backward all-reduces the input gradient: per layer 2
all-reduces of b·s·h in forward and 2 in backward.

The embedding splits the vocabulary: rank r holds rows [r·V/t, (r+1)·V/t) of the (padded)
table, looks up the ids in its range, zeroes the others, and g sums the ranks' outputs.
The output head (`VocabParallelHead`) reuses that slice (tied weights), so each rank has 1/t
of the logits; the
vocab-parallel cross entropy works on them without ever gathering the full logits: one
all-reduce MAX for the stable softmax, one SUM of exp, one SUM of the target's logit.

Every split parameter carries `tp_split = (dim, blocks, full_size)`: it is the rank's part
of `blocks` equal sections along `dim` (3 for Q, K, V), `full_size` before vocab padding.
`gather_split` rebuilds the dense tensor from the ranks' parts.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from .. import comm
from .ops import copy_to_tp, reduce_from_tp
from .sequence import (
    gather_from_sequence,
    linear_with_sequence_gather,
    reduce_scatter_to_sequence,
)


def _split(t: torch.Tensor, dim: int, blocks: int, group, pad_to: int | None = None):
    n, r = dist.get_world_size(group), dist.get_rank(group)
    if pad_to is not None and pad_to > t.shape[dim]:
        pad = [0, 0] * (t.dim() - 1 - dim) + [0, pad_to - t.shape[dim]]
        t = F.pad(t, pad)
    if t.shape[dim] % (n * blocks):
        raise ValueError(
            f"tensor parallel: size {t.shape[dim]} along dim {dim} is not divisible by "
            f"tp={n}" + (f" × {blocks} sections" if blocks > 1 else "")
        )
    sections = t.chunk(blocks, dim)
    return torch.cat([s.chunk(n, dim)[r] for s in sections], dim).clone()


def _param(local: torch.Tensor, like: torch.Tensor, split=None) -> nn.Parameter:
    p = nn.Parameter(local, requires_grad=like.requires_grad)
    if split is not None:
        p.tp_split = split
    return p


@torch.no_grad()
def gather_split(local: torch.Tensor, split: tuple[int, int, int], group) -> torch.Tensor:
    """The dense tensor from every rank's part (`split` = (dim, blocks, full size))."""
    dim, blocks, size = split
    n = dist.get_world_size(group)
    out = torch.empty(n * local.numel(), dtype=local.dtype, device=local.device)
    comm.all_gather(out, local.contiguous().reshape(-1), group=group, tag="full-state")
    parts = [p.view(local.shape).chunk(blocks, dim) for p in out.chunk(n)]
    full = torch.cat([torch.cat([p[b] for p in parts], dim) for b in range(blocks)], dim)
    return full.narrow(dim, 0, size)


class ColumnParallelLinear(nn.Module):
    """y_r = f(x) W_rᵀ + b_r, W split by output rows (in `blocks` sections: 3 for Q, K, V)."""

    sequence_parallel = False  # lesson 14: the input is this rank's block of the sequence
    entered = False  # True: f (or the sequence all-gather) ran at the enclosing module's input

    def __init__(self, dense: nn.Linear, group, blocks: int = 1, pad_to: int | None = None):
        """`pad_to`: the output rows padded with zero rows to this many first (an output
        head over a vocabulary t does not divide: `vocab_head`)."""
        super().__init__()
        self.group = group
        split = (0, blocks, dense.out_features)
        w = _split(dense.weight.detach(), 0, blocks, group, pad_to)
        self.weight = _param(w, dense.weight, split)
        self.bias = None
        if dense.bias is not None:
            b = _split(dense.bias.detach(), 0, blocks, group, pad_to)
            self.bias = _param(b, dense.bias, split)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.entered:  # the input entered the region once, before the module's projections
            return F.linear(x, self.weight, self.bias)
        if self.sequence_parallel:  # all-gather the sequence instead of f
            return linear_with_sequence_gather(x, self.weight, self.bias, self.group)
        return F.linear(copy_to_tp(x, self.group), self.weight, self.bias)


def vocab_slice(vocab: int, group) -> tuple[int, int]:
    """(V', start): the vocabulary padded to a multiple of tp (Megatron-LM's
    `make_vocab_size_divisible_by`) and the first id of this rank's V'/t rows."""
    n = dist.get_world_size(group)
    padded = -(-vocab // n) * n
    return padded, dist.get_rank(group) * (padded // n)


def vocab_head(dense: nn.Linear, group) -> ColumnParallelLinear:
    """An untied output head over the vocabulary: column-parallel, its rows padded with
    zero rows to a multiple of tp (Megatron-LM's `make_vocab_size_divisible_by`); rank r
    gives the logits of ids [start, start + V'/t). The padding columns are masked out of
    the softmax by `vocab_parallel_cross_entropy` (ids ≥ `vocab_size`), so their rows never
    get a gradient and stay zero; `gather_split` leaves them out (`tp_split`'s full size)."""
    padded, start = vocab_slice(dense.out_features, group)
    head = ColumnParallelLinear(dense, group, pad_to=padded)
    head.start, head.vocab_size = start, dense.out_features
    return head


class RowParallelLinear(nn.Module):
    """y = g(x_r W_rᵀ) + b, W split by input columns; the input is already split."""

    sequence_parallel = False  # lesson 14: reduce-scatter along the sequence instead of g

    def __init__(self, dense: nn.Linear, group):
        super().__init__()
        self.group = group
        split = (1, 1, dense.in_features)
        self.weight = _param(_split(dense.weight.detach(), 1, 1, group), dense.weight, split)
        self.bias = None if dense.bias is None else _param(dense.bias.detach().clone(), dense.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        reduce = reduce_scatter_to_sequence if self.sequence_parallel else reduce_from_tp
        y = reduce(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias


class TensorParallelRNG:
    """Random numbers inside a tensor-parallel region: a stream of its own per tp rank.

    Megatron-LM's rule (Shoeybi et al. 2019, section 3): dropout on split activations (a
    rank's own heads) must differ between tp ranks, or every rank would drop the same
    positions of its different heads; outside the regions (replicated activations) every
    tp rank must draw the same masks. So the default generator, seeded alike everywhere,
    serves outside; inside, `fork()` swaps in this rank's stream (seed + 2718 + tp rank, as
    Megatron-LM does) and saves where it got to. The stream is the one of `device`'s
    generator: the CPU's, or on a GPU the CUDA generator that its dropout draws from
    (Megatron-LM's `CudaRNGStatesTracker`).
    """

    def __init__(self, seed: int, group, device="cpu"):
        self.device = torch.device(device)
        seeded = torch.Generator(device=self.device).manual_seed(seed + 2718 + dist.get_rank(group))
        self.state = seeded.get_state()

    @contextlib.contextmanager
    def fork(self):
        if self.device.type == "cuda":
            with torch.random.fork_rng(devices=[self.device]):
                torch.cuda.set_rng_state(self.state, self.device)
                yield
                self.state = torch.cuda.get_rng_state(self.device)
            return
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self.state)
            yield
            self.state = torch.get_rng_state()


def parallel_mlp(dense: nn.Sequential, group) -> nn.Sequential:
    """Linear(h, 4h) column-parallel, GELU, Linear(4h, h) row-parallel: names kept."""
    return nn.Sequential(
        ColumnParallelLinear(dense[0], group), dense[1], RowParallelLinear(dense[2], group)
    )


class VocabParallelEmbedding(nn.Module):
    """Rows [r·V'/t, (r+1)·V'/t) of the table (V padded to V' = a multiple of t)."""

    sequence_parallel = False  # lesson 14: reduce-scatter along the sequence instead of g

    def __init__(self, dense: nn.Embedding, group):
        super().__init__()
        self.group, self.vocab_size = group, dense.num_embeddings
        padded, self.start = vocab_slice(self.vocab_size, group)
        self.per_rank = padded // dist.get_world_size(group)
        w = dense.weight.detach()
        self.weight = _param(
            _split(w, 0, 1, group, pad_to=padded), dense.weight, (0, 1, w.shape[0])
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.start) | (ids >= self.start + self.per_rank)
        local = (ids - self.start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        reduce = reduce_scatter_to_sequence if self.sequence_parallel else reduce_from_tp
        return reduce(out, self.group)


class VocabParallelHead(nn.Module):
    """The output head's rows of the (padded) vocabulary this rank's embedding slice holds:
    logits for columns [start, start + V'/t) of f(x) (under sequence parallelism, of the
    gathered sequence; `entered`: the input already entered the region). Tied to a
    `VocabParallelEmbedding`, its `weight` is the embedding's (as the dense GPT ties them)."""

    sequence_parallel = False  # lesson 14: all-gather the sequence instead of f
    entered = False

    def __init__(self, dense: nn.Linear, group, weight: nn.Parameter | None = None):
        super().__init__()
        self.group, vocab = group, dense.out_features
        padded, self.start = vocab_slice(vocab, group)
        self.vocab_size = vocab
        if weight is None:  # not tied to an embedding slice held here
            w = dense.weight.detach()
            weight = _param(_split(w, 0, 1, group, pad_to=padded), dense.weight, (0, 1, vocab))
        self.weight = weight
        self.bias = None
        if dense.bias is not None:
            b = _split(dense.bias.detach(), 0, 1, group, pad_to=padded)
            self.bias = _param(b, dense.bias, (0, 1, vocab))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.entered:
            x = (gather_from_sequence if self.sequence_parallel else copy_to_tp)(x, self.group)
        return F.linear(x, self.weight, self.bias)


IGNORE_INDEX = -100  # the targets that count for nothing (padding), as in F.cross_entropy


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, group, start, vocab_size, reduction):
        valid = targets != IGNORE_INDEX
        targets = targets.masked_fill(~valid, start)  # any column: its loss is masked out
        logits = logits.float()
        columns = start + torch.arange(logits.shape[-1], device=logits.device)
        logits = logits.masked_fill(columns >= vocab_size, float("-inf"))  # vocab padding
        peak = logits.max(dim=-1).values
        comm.all_reduce(peak, op=comm.ReduceOp.MAX, group=group, tag="tp-ce-max")
        exp = (logits - peak.unsqueeze(-1)).exp()
        total = exp.sum(dim=-1)
        comm.all_reduce(total, group=group, tag="tp-ce-sum-exp")
        inside = (targets >= start) & (targets < start + logits.shape[-1])
        local_t = (targets - start).masked_fill(~inside, 0)
        target_logit = (logits - peak.unsqueeze(-1)).gather(-1, local_t.unsqueeze(-1)).squeeze(-1)
        target_logit = target_logit.masked_fill(~inside, 0.0)
        comm.all_reduce(target_logit, group=group, tag="tp-ce-target")
        # an ignored target's row saved as zeros (no gradient): nothing more is kept
        ctx.save_for_backward(
            exp / total.unsqueeze(-1) * valid.unsqueeze(-1), local_t, inside & valid
        )
        losses = (total.log() - target_logit) * valid
        # the mean over the valid targets (F.cross_entropy's with ignore_index), or their sum
        ctx.divisor = max(int(valid.sum()), 1) if reduction == "mean" else 1
        return losses.sum() / ctx.divisor

    @staticmethod
    def backward(ctx, grad):
        softmax, local_t, inside = ctx.saved_tensors
        g = softmax.clone()
        hit = torch.zeros_like(g).scatter_(-1, local_t.unsqueeze(-1), 1.0)
        g -= hit * inside.unsqueeze(-1)
        return g * (grad / ctx.divisor), None, None, None, None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    group,
    start: int,
    vocab_size: int,
    reduction: str = "mean",
) -> torch.Tensor:
    """Cross entropy from this rank's logits columns [start, start + local); the full logits
    are never formed. Equal to `F.cross_entropy(..., ignore_index=-100, reduction=)` on the
    gathered logits: targets of -100 count for nothing ("mean": over the others)."""
    if reduction not in ("mean", "sum"):
        raise ValueError(
            f"vocab_parallel_cross_entropy: reduction={reduction!r} must be 'mean' or 'sum'"
        )
    return _VocabParallelCrossEntropy.apply(logits, targets, group, start, vocab_size, reduction)
