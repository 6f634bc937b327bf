"""The course GPT in tensor-parallel form, made from the dense GPT (so both start equal).

Shoeybi et al. 2019, "Megatron-LM", section 3 and Figure 2: every block's attention and MLP
are tensor-parallel regions (f ... g); layer norms, position embeddings and the biases added
after a g are replicated: every tp rank holds and updates the same copy, from the same
(all-reduced) gradient. The token embedding is vocab-parallel and tied to the output head;
the loss is the vocab-parallel cross entropy (`loss`).

`sequence_parallel=True` (Korthikanti et al. 2022, section 4.2.2; lesson 14; megatron-core's
`sequence_parallel` option): between the regions, layer norms and residual adds work on this
rank's block of the sequence; each region starts with an all-gather of the sequence and ends
with a reduce-scatter of it, and the replicated parameters' gradients (each rank's covers
only its block) are all-reduced over the tp group as backward produces them.

`TensorParallelGPT` meets the comparison contract: `full_parameters()` / `full_grads()`
rebuild the dense tensors under the dense model's names. Parameter names are the dense
ones (`blocks.0.attn.qkv.weight`, `blocks.0.mlp.0.weight`, ...).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..models import GPT, require_course_gpt
from ..parallel import ParallelModule, broadcast_parameters, verify_same_model
from .layers import (
    ParallelAttention,
    VocabParallelEmbedding,
    gather_split,
    parallel_mlp,
    vocab_parallel_cross_entropy,
)
from .ops import copy_to_tp
from .sequence import (
    allreduce_replicated_grad,
    check_sequence,
    gather_from_sequence,
    sequence_block,
)


class ParallelBlock(nn.Module):
    def __init__(self, dense, group):
        super().__init__()
        self.ln1, self.ln2 = copy.deepcopy(dense.ln1), copy.deepcopy(dense.ln2)
        self.attn = ParallelAttention(dense.attn, group)
        self.mlp = parallel_mlp(copy.deepcopy(dense.mlp), group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TensorParallelGPT(ParallelModule):
    """The GPT split over the ranks of `group` (a tp group, e.g. `ParallelLayout.group("tp")`)."""

    def __init__(self, dense: GPT, group=None, sequence_parallel: bool = False):
        super().__init__()
        require_course_gpt(dense, "TensorParallelGPT")
        if not isinstance(sequence_parallel, bool):
            raise TypeError(
                f"TensorParallelGPT: sequence_parallel must be True or False, "
                f"got {sequence_parallel!r}"
            )
        n = dist.get_world_size(group)
        cfg = dense.cfg
        for name, value in (
            ("hidden", cfg.hidden),
            ("heads", cfg.heads),
            ("4·hidden", 4 * cfg.hidden),
        ):
            if value % n:
                raise ValueError(f"TensorParallelGPT: {name}={value} is not divisible by tp={n}")
        config = {"sequence_parallel": sequence_parallel}
        verify_same_model(dense, group, "TensorParallelGPT", config)
        broadcast_parameters(dense, group)  # ranks seeded differently still cut one model
        self.group, self.cfg = group, cfg
        self.tok_emb = VocabParallelEmbedding(dense.tok_emb, group)
        self.pos_emb = copy.deepcopy(dense.pos_emb)
        self.blocks = nn.ModuleList(ParallelBlock(b, group) for b in dense.blocks)
        self.ln_f = copy.deepcopy(dense.ln_f)
        self.sequence_parallel = sequence_parallel
        if sequence_parallel:
            check_sequence(cfg.seq_len, group)
            for module in self.modules():
                if hasattr(type(module), "sequence_parallel"):
                    module.sequence_parallel = True
            for p in self.parameters():
                if p.requires_grad and not hasattr(p, "tp_split"):
                    p.register_hook(lambda g: allreduce_replicated_grad(g, self.group))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """This rank's columns of the logits (vocab-parallel), [batch, seq, V'/t]."""
        if idx.dim() != 2 or idx.shape[1] > self.cfg.seq_len:
            raise ValueError(
                f"TensorParallelGPT: idx must be [batch, seq] with seq <= cfg.seq_len="
                f"{self.cfg.seq_len} (the position table's length); got {tuple(idx.shape)}"
            )
        start, stop = 0, idx.shape[1]
        if self.sequence_parallel:  # the embedding reduce-scatters: this rank's block
            start, stop = sequence_block(idx.shape[1], self.group)
        pos = torch.arange(start, stop, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        enter = gather_from_sequence if self.sequence_parallel else copy_to_tp
        return F.linear(enter(x, self.group), self.tok_emb.weight)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        emb = self.tok_emb
        return vocab_parallel_cross_entropy(logits, targets, self.group, emb.start, emb.vocab_size)

    def _full(self, tensor_of) -> dict[str, torch.Tensor]:
        out = {}
        for name, p in self.named_parameters():
            t = tensor_of(p)
            if t is None:
                continue
            split = getattr(p, "tp_split", None)
            out[name] = gather_split(t, split, self.group) if split else t.detach().clone()
        return out

    def full_parameters(self) -> dict[str, torch.Tensor]:
        return self._full(lambda p: p)

    def full_grads(self) -> dict[str, torch.Tensor]:
        return self._full(lambda p: p.grad)
