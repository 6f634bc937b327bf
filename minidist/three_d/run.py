"""The 3D run: the course GPT (4 blocks, 4 heads) on t × p × d ranks, SGD with momentum
through ZeRO-1 over the data-parallel group, 1F1B over 4 micro-batches, 20 steps."""

from __future__ import annotations

import torch

from ..data import shard_batch
from ..data_parallel.fixture import build
from ..megatron.layout import ParallelLayout
from ..training import make_optimizer, train
from ..zero.optimizer import ZeroRedundancyOptimizer
from .parallel import ThreeDParallel

GPT_3D = dict(layers=4, heads=4, steps=20, global_batch=16)
MICROBATCHES = 4


def reference_losses() -> list[float]:
    """The same GPT, data and SGD in one process."""
    model, batches, loss_fn = build("gpt", **GPT_3D)
    return train(model, batches, loss_fn, make_optimizer(model.parameters())).losses


def train_3d(tp: int = 2, pp: int = 2) -> dict:
    """On every rank of a world of tp · pp · d ranks: the 20 steps; losses and final state."""
    model, batches, _ = build("gpt", **GPT_3D)
    layout = ParallelLayout(tp=tp, pp=pp)
    pipe = ThreeDParallel(model, layout, "1f1b", MICROBATCHES)
    dp = layout.group("dp")  # a group of one when d = 1 (None would mean the whole world)
    opt = ZeroRedundancyOptimizer(
        pipe.module.parameters(), torch.optim.SGD, group=dp, lr=0.05, momentum=0.9
    )
    losses = []
    for batch in batches:
        opt.zero_grad()
        local = shard_batch(batch, layout.dp_rank, layout.dp_size)
        losses.append(pipe.train_step(local))
        opt.step()
    if layout.dp_size > 1:  # every replica's loss is its slice's: the mean is the batch's
        from .. import comm

        mean = torch.tensor(losses, device=comm.group_device(dp))

        comm.all_reduce(mean, group=dp, tag="loss")
        mean /= layout.dp_size
    else:
        mean = torch.tensor(losses, device="cpu")
    return {"losses": mean.tolist(), "params": pipe.full_parameters(), "grid": layout.mine}
