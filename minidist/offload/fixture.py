"""The rank function lesson 05's tests (and later its notebook and tour) share: lesson 03's
FSDP on the course GPT, its chunks stepped by an `OffloadOptimizer` (or plain Adam)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ..data import shard_batch
from ..data_parallel.fixture import build
from ..fsdp.fixture import UNITS
from ..fsdp.fully_sharded import FullyShardedDataParallel
from ..training import TrainTrace, train
from ..zero.fixture import ADAM
from .optimizer import OffloadOptimizer


def train_on_rank(tier: str | None, path: str | None = None) -> tuple[TrainTrace, dict]:
    """FSDP training with Adam on the device (`tier=None`) or offloaded to `tier`.

    Returns the trace and what the offload held and moved: resident bytes per tier after
    the last step, bytes moved per step each way, the files the disk tier used.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build("gpt")
    fsdp = FullyShardedDataParallel(model, wrap=UNITS["gpt"])
    if tier is None:
        opt = torch.optim.Adam(fsdp.sharded_parameters(), **ADAM)
    else:
        opt = OffloadOptimizer(fsdp.sharded_parameters(), tier=tier, path=path, **ADAM)
    trace = train(fsdp, [shard_batch(b, rank, world) for b in batches], loss_fn, opt)
    if tier is None:
        return trace, {}
    info = {
        "resident": opt.resident_bytes(),
        "moved_per_step": {k: v / len(batches) for k, v in opt.moved.items()},
        "files": sorted(os.listdir(opt.directory)) if opt.directory else [],
        "owned": sum(p.numel() for p in fsdp.sharded_parameters()),
    }
    opt.close()
    return trace, info
