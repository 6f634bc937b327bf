"""The rank functions lesson 03's notebook, tests and tour share.

Lesson 01's models (`minidist.data_parallel.fixture.build`: a tied and a frozen parameter),
cut into units the usual way: one per transformer block (the GPT) or per Linear layer (the
MLP), the root taking the rest (embeddings, tied head, final norm). Adam throughout, as in
lesson 02 (`minidist.zero.fixture`), so the reference is the same.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import comm
from ..data import shard_batch
from ..data_parallel.fixture import build
from ..memory import ModelStateBytes, state_bytes
from ..models import Block
from ..training import TrainTrace, train
from ..zero.fixture import ADAM, build_args
from .fully_sharded import FullyShardedDataParallel

UNITS = {"gpt": lambda m: isinstance(m, Block), "mlp": lambda m: isinstance(m, nn.Linear)}


def train_on_rank(
    name: str, **options
) -> tuple[TrainTrace, comm.Ledger, ModelStateBytes, list[int]]:
    """On a rank: FSDP (`options` go to FullyShardedDataParallel) on this rank's slices.

    Returns (trace, ledger of the training steps, model-state bytes after the last step,
    each unit's number of elements, root last).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build(name, **build_args(name))
    fsdp = FullyShardedDataParallel(model, wrap=UNITS[name], **options)
    opt = torch.optim.Adam(fsdp.sharded_parameters(), **ADAM)
    local = [shard_batch(b, rank, world) for b in batches]
    with comm.record() as ledger:
        trace = train(fsdp, local, loss_fn, opt)
    return trace, ledger, fsdp_state_bytes(fsdp, opt), [u.numel for u in fsdp.units]


def fsdp_state_bytes(fsdp: FullyShardedDataParallel, opt) -> ModelStateBytes:
    """Parameters (chunks, anything still gathered, frozen ones), gradients and optimizer
    state this rank holds, each storage once (`minidist.memory.state_bytes`)."""
    return state_bytes(fsdp, opt).model_state()
