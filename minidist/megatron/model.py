"""The course GPT in tensor-parallel form: a copy of the dense GPT edited in place (so both
start equal), whose own forward runs.

Shoeybi et al. 2019, "Megatron-LM", section 3 and Figure 2: every block's attention and MLP
are tensor-parallel regions (f ... g); layer norms, position embeddings and the biases added
after a g are replicated: every tp rank holds and updates the same copy, from the same
(all-reduced) gradient. The token embedding is vocab-parallel and tied to the output head;
the loss is the vocab-parallel cross entropy (`loss`).

`tensor_parallel_gpt(model, group)` makes the edit: the plan `GPT_PLAN` (`plan.py`, as
torch's `parallelize_module`) swaps the modules it names for lesson 07's layers (Q, K, V and
the MLP's first Linear column-parallel, the projections after them row-parallel, the
embedding and the head vocab-parallel, the head tied to the embedding's slice again); each
attention keeps its own forward, on this rank's heads (it reads them from its projection's
width), its kernel called in this rank's dropout stream (`TensorParallelRNG`). It edits a
pipeline stage's copy of the GPT the same way (lesson 10: parts absent, a head of its own).

`sequence_parallel=True` (Korthikanti et al. 2022, section 4.2.2; lesson 14; megatron-core's
`sequence_parallel` option): between the regions, layer norms and residual adds work on this
rank's block of the sequence (the position embedding looks up the block's); each region
starts with an all-gather of the sequence and ends with a reduce-scatter of it, and the
replicated parameters' gradients (each rank's covers only its block) are all-reduced over
the tp group as backward produces them.

`TensorParallelGPT` meets the comparison contract: `full_parameters()` / `full_grads()`
rebuild the dense tensors under the dense model's names, which the edited copy (`module`)
keeps (`blocks.0.attn.qkv.weight`, `blocks.0.mlp.0.weight`, ...).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn

from ..models import ATTENTION_FUNCTIONS, GPT, require_course_gpt, sdpa_attention
from ..parallel import ParallelModule, broadcast_parameters, verify_same_model
from ..policy import module_device
from .layers import TensorParallelRNG, gather_split, vocab_parallel_cross_entropy
from .plan import GPT_PLAN, apply_plan
from .sequence import check_sequence, sequence_block

KERNEL = "minidist_tp_sdpa"  # its name in the course attentions' kernel registry


def tp_attention_kernel(module: nn.Module, query, key, value, attention_mask=None, **kwargs):
    """The course attention's kernel (`models.sdpa_attention`) on this rank's heads, its
    dropout drawn from this rank's stream (`module.rng`): each rank's heads get their own."""
    with module.rng.fork():
        return sdpa_attention(module, query, key, value, attention_mask, **kwargs)


def tensor_parallel_gpt(
    model: GPT, group, sequence_parallel: bool = False, seed: int = 0
) -> dict[str, list[str]]:
    """`model` (the course GPT, or a pipeline stage's copy of it) made tensor parallel over
    `group` in place; the module names matched, per style."""
    t = dist.get_world_size(group)
    held = (nn.Embedding, nn.Linear)  # a stage's absent embedding or head is neither
    plan = {
        name: style
        for name, style in GPT_PLAN.items()
        if name not in ("tok_emb", "lm_head") or isinstance(model.get_submodule(name), held)
    }
    tied = "tok_emb" in plan and "lm_head" in plan and model.lm_head.weight is model.tok_emb.weight
    matched = apply_plan(model, plan, group, sequence_parallel)
    if tied:  # one slice, as the dense GPT ties them
        model.lm_head.weight = model.tok_emb.weight
    ATTENTION_FUNCTIONS[KERNEL] = tp_attention_kernel
    for block in model.blocks:
        block.attn.heads //= t
        block.attn.rng = TensorParallelRNG(seed, group, module_device(block.attn))
        block.attn.attn_implementation = KERNEL
    if sequence_parallel:  # the embedding reduce-scatters this rank's block of the sequence
        model.register_forward_pre_hook(_block_positions(group), with_kwargs=True)
    return matched


def _block_positions(group):
    """A forward pre-hook giving the GPT the positions of this rank's block of the sequence
    (its `position_ids`): the position embedding looks up the block's rows only."""

    def hook(model, args, kwargs):
        idx, pos = args[0], (args[1] if len(args) > 1 else kwargs.get("position_ids"))
        seq = idx.shape[1] if pos is None else pos.shape[-1]
        start, stop = sequence_block(seq, group)
        if pos is None:
            pos = torch.arange(start, stop, device=idx.device)
        else:
            pos = pos[..., start:stop].clone()
        return (idx,), {**kwargs, "position_ids": pos}

    return hook


class TensorParallelGPT(ParallelModule):
    """The GPT split over the ranks of `group` (a tp group, e.g. `ParallelLayout.group("tp")`):
    `module`, a copy of it edited by `tensor_parallel_gpt`."""

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
        if sequence_parallel:
            check_sequence(cfg.seq_len, group)
        config = {"sequence_parallel": sequence_parallel}
        verify_same_model(dense, group, "TensorParallelGPT", config)
        broadcast_parameters(dense, group)  # ranks seeded differently still cut one model
        self.group, self.cfg, self.sequence_parallel = group, cfg, sequence_parallel
        self.module = copy.deepcopy(dense)
        tensor_parallel_gpt(self.module, group, sequence_parallel)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """This rank's columns of the logits (vocab-parallel), [batch, seq, V'/t]: the GPT's
        own forward."""
        if idx.dim() != 2 or idx.shape[1] > self.cfg.seq_len:
            raise ValueError(
                f"TensorParallelGPT: idx must be [batch, seq] with seq <= cfg.seq_len="
                f"{self.cfg.seq_len} (the position table's length); got {tuple(idx.shape)}"
            )
        return self.module(idx)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        head = self.module.lm_head
        return vocab_parallel_cross_entropy(
            logits, targets, self.group, head.start, head.vocab_size
        )

    def _full(self, tensor_of) -> dict[str, torch.Tensor]:
        out = {}
        for name, p in self.module.named_parameters():
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
