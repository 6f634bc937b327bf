"""What lesson 06's tests (and later its notebook and tour) measure: the course GPT with
dropout, its blocks run plainly, recomputed one by one, or in segments of k."""

from __future__ import annotations

import torch

from ..data_parallel.fixture import build
from ..memory import SavedActivations
from .checkpoint import checkpoint_sequential, recompute

DROPOUT_GPT = dict(layers=4, dropout=0.1)


def gpt_forward(model, x: torch.Tensor, segment: int | None = None) -> torch.Tensor:
    """The GPT's forward, its blocks in recomputed segments of `segment` (None: as is)."""
    if segment is None:
        return model(x)
    h = model.tok_emb(x) + model.pos_emb(torch.arange(x.shape[1], device=x.device))
    return model.lm_head(model.ln_f(checkpoint_sequential(model.blocks, segment, h)))


def saved_and_grads(how: str = "plain", segment: int | None = None, seed: int = 123):
    """One forward/backward in train mode (dropout on): (bytes saved for backward during
    forward, gradients). `how`: "plain", "recompute" (every block, in place), "segments"."""
    model, batches, loss_fn = build("gpt", **DROPOUT_GPT)
    model.train()
    if how == "recompute":
        for block in model.blocks:
            recompute(block)
    x, y = batches[0]
    torch.manual_seed(seed)
    with SavedActivations(model) as saved:
        loss = loss_fn(gpt_forward(model, x, segment if how == "segments" else None), y)
    loss.backward()
    return saved.bytes, {
        n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }


def block_bytes() -> tuple[int, int]:
    """(bytes one block saves for backward, bytes of its input) on the fixture's batch."""
    model, batches, _ = build("gpt", **DROPOUT_GPT)
    x = batches[0][0]
    h = model.tok_emb(x) + model.pos_emb(torch.arange(x.shape[1]))
    with SavedActivations(model) as saved:
        model.blocks[0](h)
    return saved.bytes, h.numel() * h.element_size()
