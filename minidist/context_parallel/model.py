"""The course GPT with its sequence split over a context-parallel group (lesson 15).

Every rank holds the whole model and 1/c of every sequence's tokens (`split.positions`:
contiguous or zig-zag). Everything but attention acts on each token alone, so the model's
own forward runs on the rank's tokens at their global positions (`position_ids`); only the
attention's kernel call is swapped for `ring_attention` (`kernel.py`), the rank's queries
against every rank's keys and values passed around the ring (Liu et al. 2023, "Ring
Attention", section 3).
Each rank's gradients come from its own tokens only: `finish_gradient_sync` sums them over
the group in one all-reduce (Megatron-LM reduces them over the data × context ranks), and
the loss is the mean over every token of the batch, its value all-reduced.

`ContextParallelGPT` meets the comparison contract: every rank holds the whole model under
the dense names, so `full_parameters()` / `full_grads()` are the replicated defaults.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .. import comm
from ..models import ATTENTION_FUNCTIONS, GPT, require_course_gpt
from ..parallel import ParallelModule, broadcast_parameters, verify_same_model
from .kernel import NAME, ring_attention_kernel
from .split import check_split, positions


class ContextParallelGPT(ParallelModule):
    """The GPT on this rank's 1/c of every sequence; `layout` is "zigzag" or "contiguous"."""

    def __init__(self, dense: GPT, group=None, layout: str = "zigzag"):
        super().__init__()
        require_course_gpt(dense, "ContextParallelGPT")
        cfg = dense.cfg
        c = dist.get_world_size(group)
        check_split(cfg.seq_len, c, layout)
        if cfg.dropout:
            raise ValueError(
                f"ContextParallelGPT: dropout={cfg.dropout}; ring attention here has no "
                "dropout (each block's probabilities are recomputed in backward): use 0."
            )
        verify_same_model(dense, group, "ContextParallelGPT", {"layout": layout})
        broadcast_parameters(dense, group)  # ranks seeded differently still cut one model
        self.module = copy.deepcopy(dense)
        ATTENTION_FUNCTIONS[NAME] = ring_attention_kernel
        for block in self.module.blocks:  # only the attention's kernel call is swapped
            block.attn.attn_implementation = NAME
            block.attn.cp_ring = (group, layout, cfg.seq_len)
        self.group, self.layout, self.c = group, layout, c
        self.rank = dist.get_rank(group)

    def positions(self, seq: int, device=None) -> torch.Tensor:
        """The global positions of this rank's tokens."""
        if seq != self.module.cfg.seq_len:
            raise ValueError(
                f"ContextParallelGPT: sequences of {seq} tokens; the ring is built for "
                f"cfg.seq_len={self.module.cfg.seq_len}"
            )
        return positions(seq, self.c, self.rank, self.layout, device)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """This rank's rows of the logits, [batch, s/c, V], from the whole batch of ids
        (a data loader for context parallelism would hand each rank only its tokens)."""
        pos = self.positions(idx.shape[1], idx.device)
        return self.module(idx[:, pos], position_ids=pos)  # the model's own forward

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean cross entropy over every token of the batch: this rank's sum over its
        tokens / all tokens, whose gradient is this rank's share; its value all-reduced."""
        mine = targets[:, self.positions(targets.shape[1], targets.device)]
        total = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), mine.reshape(-1), reduction="sum"
        )
        value = total.detach().clone()
        comm.all_reduce(value, group=self.group, tag="cp-loss")
        return total / targets.numel() + (value - total.detach()) / targets.numel()

    def finish_gradient_sync(self) -> None:
        """Sum the ranks' gradients (each from its own tokens) in one flat all-reduce."""
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        comm.all_reduce(flat, group=self.group, tag="cp-grads")
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
