"""A pipeline stage of the course GPT: consecutive blocks cut from the dense model, the first
stage with the embeddings, the last with the final norm and the (tied) head (Huang et al.
2019, "GPipe", section 2; Narayanan et al. 2021, section 2.2 for the chunks of interleaving)."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

from ..models import GPT


class GPTStage(nn.Module):
    """Blocks `blocks` of `dense` (names kept: `blocks.3.ln1.weight`), plus the embeddings on
    the first stage and the final norm and (tied) head on the last."""

    def __init__(self, dense: GPT, blocks: range, first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.tok_emb, self.pos_emb = copy.deepcopy(dense.tok_emb), copy.deepcopy(dense.pos_emb)
        self.blocks = nn.ModuleDict({str(i): copy.deepcopy(dense.blocks[i]) for i in blocks})
        if last:
            self.ln_f = copy.deepcopy(dense.ln_f)
            self.lm_head = nn.Linear(dense.cfg.hidden, dense.cfg.vocab_size, bias=False)
            self.lm_head.weight = (
                self.tok_emb.weight
                if first
                else nn.Parameter(dense.tok_emb.weight.detach().clone())
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.tok_emb(x) + self.pos_emb(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks.values():
            x = block(x)
        return self.lm_head(self.ln_f(x)) if self.last else x


def split_gpt(dense: GPT, stages: int, stage: int) -> GPTStage:
    """Stage `stage` of `stages`, the blocks dealt out as evenly as possible."""
    layers = dense.cfg.layers
    if not 1 <= stages <= layers:
        raise ValueError(f"split_gpt: stages={stages} must be between 1 and layers={layers}")
    bounds = [round(k * layers / stages) for k in range(stages + 1)]
    return GPTStage(dense, range(bounds[stage], bounds[stage + 1]), stage == 0, stage == stages - 1)
