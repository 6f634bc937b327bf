"""The rank functions lesson 15's notebook, tests, checker and tour share.

The model is lesson 07's GPT with 4 heads (sequence 16, hidden 32, 2 layers, vocabulary 30,
tied embedding, frozen `ln_f.bias`) and its global batches, trained with SGD + momentum: 16
tokens split in 2c = 8 chunks at c = 4.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .. import comm
from ..megatron.fixture import build_dense
from ..memory import SavedActivations
from ..training import TrainTrace, make_optimizer, train
from .model import ContextParallelGPT
from .ring import ring_attention, work_per_forward
from .split import positions


class CPRun(NamedTuple):
    trace: TrainTrace
    records: list[comm.CommRecord]
    trainable: int
    work: list[int]  # chunk pairs computed per ring-attention forward


def train_on_rank(layout: str = "zigzag", **sizes) -> CPRun:
    """On a rank: `ContextParallelGPT` over the whole world, trained like the reference."""
    model, batches, _ = build_dense(**sizes)
    cp = ContextParallelGPT(model, None, layout)
    opt = make_optimizer(cp.parameters())
    work_per_forward()
    with comm.record() as ledger:
        trace = train(cp, batches, cp.loss, opt)
    trainable = sum(p.numel() for p in cp.parameters() if p.requires_grad)
    return CPRun(trace, list(ledger.records), trainable, work_per_forward())


def attention_rank(layout: str, batch: int = 2, heads: int = 4, seq: int = 16, dim: int = 8):
    """On a rank: ring attention on this rank's positions of the same q, k, v (float64)
    against torch's attention on the whole sequence; (largest difference of the output and
    of the three gradients, bytes saved for backward here and by the whole attention)."""
    c, r = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(0)
    q, k, v, up = (
        torch.randn(batch, heads, seq, dim, device="cpu", generator=g, dtype=torch.float64)
        for _ in "qkvu"
    )
    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    with SavedActivations() as saved_whole:
        ref = F.scaled_dot_product_attention(*whole, is_causal=True)
    ref.backward(up)
    pos = positions(seq, c, r, layout)
    mine = [t[:, :, pos].clone().requires_grad_() for t in (q, k, v)]
    with SavedActivations() as saved:
        out = ring_attention(*mine, None, layout)
    out.backward(up[:, :, pos])
    diffs = [float((out - ref[:, :, pos]).detach().abs().max())]
    diffs += [float((m.grad - w.grad[:, :, pos]).abs().max()) for m, w in zip(mine, whole)]
    return max(diffs), saved.bytes, saved_whole.bytes


def layer_activations_rank(layout: str = "zigzag", batch: int = 8) -> int:
    """On a rank: bytes one block saves for backward on this rank's tokens."""
    model = build_dense().model
    cp = ContextParallelGPT(model, None, layout)
    pos = cp.positions(model.cfg.seq_len)
    x = torch.randn(batch, len(pos), model.cfg.hidden, requires_grad=True, device="cpu")
    with SavedActivations(cp) as saved:
        cp.module.blocks[0](x)
    return saved.bytes
