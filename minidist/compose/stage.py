"""A pipeline chunk of the course GPT, its MoE form or a Hugging Face-layout Llama.

Step 1 of `parallelize`: the chunk holds consecutive blocks of the whole model, the first
chunk also the embeddings, the last the final norm and the output head, each module a
deep copy of the whole model's under the **same name** (`blocks.3.attn.qkv`,
`model.layers.3.self_attn.q_proj`), so the later steps' plans and the one-process names
apply to the chunk as they are. The GPT's head is tied to its token embedding: a last chunk
without the first keeps a copy of the embedding as `lm_head` (kept equal by summing the
two copies' gradients over the embedding group, lesson 09).

The chunk runs the model's own modules in the model's order; only the data changes: the
ids are this rank's tokens (its zig-zag chunks under cp), and under sequence parallelism
the residual stream is this rank's block of them. Between chunks activations travel in
float32 (the engine's buffers), inside in the compute dtype.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..megatron.layers import vocab_parallel_cross_entropy
from ..megatron.ops import copy_to_tp
from ..megatron.sequence import gather_from_sequence
from ..models import lm_loss


def family(model: nn.Module) -> str:
    """ "gpt" (the course GPT and its MoE form) or "llama" (Hugging Face's layout)."""
    if hasattr(model, "blocks") and hasattr(model, "tok_emb"):
        return "gpt"
    if hasattr(model, "model") and hasattr(model.model, "layers") and hasattr(model, "lm_head"):
        return "llama"
    raise ValueError(
        f"parallelize: {type(model).__name__} is neither the course GPT (tok_emb, blocks, "
        "ln_f) nor in Hugging Face's Llama layout (model.embed_tokens, model.layers, "
        "model.norm, lm_head)"
    )


class Chunk(nn.Module):
    def __init__(self, model: nn.Module, layers: range, first: bool, last: bool, ctx):
        super().__init__()
        self.kind, self.first, self.last, self.ctx = family(model), first, last, ctx
        self.dtype, self.tp_group, self.sequence_parallel = torch.float32, None, False
        if self.kind == "gpt":
            self.tied = True
            if first:
                self.tok_emb, self.pos_emb = copy.deepcopy((model.tok_emb, model.pos_emb))
            self.blocks = nn.ModuleDict({str(i): copy.deepcopy(model.blocks[i]) for i in layers})
            if last:
                self.ln_f = copy.deepcopy(model.ln_f)
                self.lm_head = self.tok_emb if first else copy.deepcopy(model.tok_emb)
            return
        self.tied = model.lm_head.weight is model.model.embed_tokens.weight
        if self.tied:
            raise ValueError(
                "parallelize: a Llama-layout model with a tied lm_head is not "
                "supported (Llama's is untied)"
            )
        self.model = nn.Module()
        if first:
            self.model.embed_tokens = copy.deepcopy(model.model.embed_tokens)
        self.model.layers = nn.ModuleDict(
            {str(i): copy.deepcopy(model.model.layers[i]) for i in layers}
        )
        if last:
            self.model.norm = copy.deepcopy(model.model.norm)
            self.lm_head = copy.deepcopy(model.lm_head)

    def layers(self) -> list[nn.Module]:
        return list((self.blocks if self.kind == "gpt" else self.model.layers).values())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            if self.kind == "gpt":
                pos = self.ctx.positions.to(x.device)
                if self.sequence_parallel:  # the embedding reduce-scattered: our block
                    t, r = self.tp_size, self.tp_rank
                    pos = pos.chunk(t)[r]
                h = self.tok_emb(x) + self.pos_emb(pos)
            else:
                h = self.model.embed_tokens(x)
        else:
            h = x
        h = h.to(self.dtype)
        for layer in self.layers():
            h = layer(h)
        if not self.last:
            return h.float()
        if self.kind == "llama":
            return self.lm_head(self.model.norm(h)).float()
        h = self.ln_f(h)
        if self.tp_group is None:
            return F.linear(h, self.lm_head.weight).float()
        enter = gather_from_sequence if self.sequence_parallel else copy_to_tp
        return F.linear(enter(h, self.tp_group), self.lm_head.weight).float()

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean cross entropy over this rank's tokens (vocab-parallel under tp)."""
        if self.tp_group is None:
            return lm_loss(logits, targets)
        head = self.lm_head  # the vocabulary-parallel embedding or `vocab_head`
        return vocab_parallel_cross_entropy(
            logits, targets, self.tp_group, head.start, head.vocab_size
        )
