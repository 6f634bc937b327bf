"""The rank functions lesson 02's notebook, tests and tour share.

The models and batches are lesson 01's (`minidist.data_parallel.fixture.build`: a tied and a
frozen parameter); `ZERO_MLP` makes the last bias 3 elements, fewer than 4 ranks, so that
with small buckets some ranks own padding only. Adam is the optimizer throughout.

`train_on_rank` runs ZeRO stage 1 or 2 on a rank, `reference` the same model in one process,
`ddp_state_bytes_on_rank` measures stage 0 (lesson 01's DDP with the same Adam).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import comm
from ..data import shard_batch
from ..data_parallel import BucketedDataParallel
from ..data_parallel.fixture import build
from ..memory import ModelStateBytes, state_bytes
from ..training import TrainTrace, train
from .sharded import ZeroDataParallel

ADAM = dict(lr=1e-2)
ZERO_MLP = dict(out_dim=3)  # a parameter with fewer elements than ranks


def build_args(name: str) -> dict:
    return ZERO_MLP if name == "mlp" else {}


def reference(name: str) -> TrainTrace:
    """The same model trained with Adam in one process on the whole global batches."""
    model, batches, loss_fn = build(name, **build_args(name))
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], **ADAM)
    return train(model, batches, loss_fn, opt)


def train_on_rank(
    stage: int, name: str, **options
) -> tuple[TrainTrace, comm.Ledger, ModelStateBytes, int]:
    """On a rank: ZeRO `stage` on this rank's slices, with Adam.

    Returns (trace, ledger of the training steps, model-state bytes after the last step,
    padded trainable elements).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build(name, **build_args(name))
    zero = ZeroDataParallel(model, stage=stage, **{**ADAM, **options})
    local = [shard_batch(b, rank, world) for b in batches]
    with comm.record() as ledger:
        trace = train(zero, local, loss_fn, zero.optimizer)
    memory = zero_state_bytes(zero)
    return trace, ledger, memory, sum(b.layout.padded for b in zero.buckets)


def zero_state_bytes(zero: ZeroDataParallel) -> ModelStateBytes:
    """Parameters, gradients and optimizer state this rank holds (each storage once):
    `minidist.memory.state_bytes`'s three terms of ZeRO's formulas."""
    return state_bytes(zero).model_state()


def ddp_state_bytes_on_rank(name: str) -> tuple[ModelStateBytes, int]:
    """On a rank: stage 0 for comparison, lesson 01's `BucketedDataParallel` with the same
    Adam, after one step. Returns (model-state bytes, Adam step counters: one per tensor)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build(name, **build_args(name))
    ddp = BucketedDataParallel(model)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], **ADAM)
    x, y = shard_batch(batches[0], rank, world)
    loss_fn(ddp(x), y).backward()
    opt.step()
    return state_bytes(ddp, opt).model_state(), len(opt.state)
