"""A pipeline stage of the course GPT whose blocks are tensor parallel (lessons 07 and 09).

The stage holds consecutive blocks (`ParallelBlock`: attention heads and MLP split over the
tp group), the first stage also the vocab-parallel embedding and the position embedding, the
last the final norm and the vocab-parallel head (a split copy of the embedding, kept equal
to it through the embedding group). Parameter names are the dense model's
(`blocks.3.attn.qkv.weight`), so the comparison contract can rebuild the dense state.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..megatron.layers import VocabParallelEmbedding, vocab_parallel_cross_entropy
from ..megatron.model import ParallelBlock
from ..megatron.ops import copy_to_tp
from ..models import GPT
from ..parallel import broadcast_parameters, verify_same_model


class TensorParallelStage(nn.Module):
    def __init__(self, dense: GPT, blocks: range, first: bool, last: bool, tp_group):
        super().__init__()
        self.first, self.last, self.tp_group = first, last, tp_group
        if first:
            self.tok_emb = VocabParallelEmbedding(dense.tok_emb, tp_group)
            self.pos_emb = copy.deepcopy(dense.pos_emb)
        self.blocks = nn.ModuleDict(
            {str(i): ParallelBlock(dense.blocks[i], tp_group) for i in blocks}
        )
        if last:
            self.ln_f = copy.deepcopy(dense.ln_f)
            self.lm_head = (
                self.tok_emb if first else VocabParallelEmbedding(dense.tok_emb, tp_group)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.tok_emb(x) + self.pos_emb(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks.values():
            x = block(x)
        if not self.last:
            return x
        return F.linear(copy_to_tp(self.ln_f(x), self.tp_group), self.lm_head.weight)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        head = self.lm_head
        return vocab_parallel_cross_entropy(
            logits, targets, self.tp_group, head.start, head.vocab_size
        )


def split_tensor_parallel_gpt(dense: GPT, layout) -> TensorParallelStage:
    """This rank's stage: blocks dealt out over `layout.pp_size` stages, split over its tp group."""
    layers, p = dense.cfg.layers, layout.pp_size
    if not 1 <= p <= layers:
        raise ValueError(
            f"split_tensor_parallel_gpt: stages={p} must be between 1 and layers={layers}"
        )
    verify_same_model(dense, None, "split_tensor_parallel_gpt")
    broadcast_parameters(dense)  # every rank cuts its stage from one model
    bounds = [round(k * layers / p) for k in range(p + 1)]
    r = layout.pp_rank
    return TensorParallelStage(
        dense, range(bounds[r], bounds[r + 1]), r == 0, r == p - 1, layout.group("tp")
    )


def tp_size(layout) -> int:
    return dist.get_world_size(layout.group("tp")) if layout.tp_size > 1 else 1
