"""The rank function lesson 04's tests (and later its notebook and tour) share: lesson 03's
FSDP on the course GPT with a mixed-precision policy and a dynamic loss scaler."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import comm
from ..data import shard_batch
from ..data_parallel.fixture import build
from ..fsdp.fixture import UNITS
from ..fsdp.fully_sharded import FullyShardedDataParallel
from ..zero.fixture import ADAM
from .policy import MixedPrecision
from .scaler import DynamicLossScaler


def train_on_rank(param_dtype: torch.dtype, overflow_steps: tuple[int, ...] = (), **scaler_args):
    """FSDP with `MixedPrecision(param_dtype)` and a loss scaler; at `overflow_steps` one
    rank's gradient is made inf after backward (an injected overflow).

    Returns (losses, scales after each step, full parameters after each step, optimizer
    state snapshot after each step, all-gather payload bytes, stepped flags).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build("gpt")
    fsdp = FullyShardedDataParallel(
        model, wrap=UNITS["gpt"], mixed_precision=MixedPrecision(param_dtype)
    )
    opt = torch.optim.Adam(fsdp.sharded_parameters(), **ADAM)
    scaler = DynamicLossScaler(**scaler_args)
    out = dict(losses=[], scales=[], params=[], states=[], stepped=[])
    with comm.record() as ledger:
        for step, batch in enumerate(batches):
            x, y = shard_batch(batch, rank, world)
            opt.zero_grad()
            loss = loss_fn(fsdp(x), y)
            scaler.scale(loss).backward()
            if step in overflow_steps and rank == world - 1:
                fsdp.sharded_parameters()[0].grad[0] = float("inf")
            out["stepped"].append(scaler.step(opt))
            scaler.update()
            out["losses"].append(loss.item())
            out["scales"].append(scaler.get_scale())
            out["params"].append(fsdp.full_parameters())
            out["states"].append([{k: v.clone() for k, v in s.items()} for s in opt.state.values()])
    out["all_gather_bytes"] = sum(
        r.payload_bytes for r in ledger.records if r.op == "all_gather" and r.tag != "full-state"
    )
    return out
