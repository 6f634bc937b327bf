"""Helpers the data-parallel checkers share: the fixture and one process's reference."""

from __future__ import annotations

import torch

from ...course.check import grads
from ..fixture import build

GLOBAL_BATCH = 12
STEPS = 2
WORLDS = (3, 2, 4)  # 3 first: there N, N-1 and 1/N are three different mistakes


def _fixture():
    """Lesson 01's MLP (3 layers, one frozen bias), smaller, and its global batches."""
    return build("mlp", steps=STEPS, global_batch=GLOBAL_BATCH, in_dim=8, hidden=16)


def _reference() -> list[dict[str, torch.Tensor]]:
    """Per-step gradients of one process training on the whole batch."""
    model, batches, loss_fn = _fixture()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        out.append(grads(model))
        opt.step()
    return out
