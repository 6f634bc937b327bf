"""The rank functions lesson 05's notebook, tests and tour share: lesson 03's FSDP on the
course GPT (one unit per block, the root holding the rest), its chunks stepped by Adam on the
device (`tier=None`) or by an `OffloadOptimizer` on the host (`"cpu"`) or on disk (`"disk"`).

- `train_on_rank`: train with `minidist.training.train` and report what each tier holds,
  what moved over the bus, what went over the network, and the disk tier's files.
- `disk_files_on_rank`: the disk tier while it lives: its files, their sizes, their contents.
- `step_times_on_rank`: measured seconds of forward + backward and of the optimizer step.
- `cuda_peak_bytes`: on a GPU, `torch.cuda.max_memory_allocated` of one device training
  with Adam on it or offloaded; None without a GPU.

`reference` (Adam in one process) is lesson 02's, `minidist.zero.fixture.reference("gpt")`.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist

from .. import comm
from ..data import shard_batch
from ..data_parallel.fixture import build
from ..fsdp.fixture import UNITS
from ..fsdp.fully_sharded import FullyShardedDataParallel
from ..memory import state_bytes
from ..training import TrainTrace, train
from ..zero.fixture import ADAM
from .optimizer import OffloadOptimizer
from .theory import STATES

# The comparison contract's gathers (`full_grads()` every step, `full_parameters()` at the
# end) are tagged so: a check, not training traffic.
CONTRACT_TAG = "full-state"
# A wider GPT for the step times, so that the step is more than Python overhead.
TIMING_GPT = dict(layers=4, hidden=128, heads=4, seq_len=32, global_batch=16)


def _fsdp(name: str = "gpt", **sizes):
    model, batches, loss_fn = build(name, **sizes)
    return FullyShardedDataParallel(model, wrap=UNITS[name]), batches, loss_fn


def _optimizer(fsdp: FullyShardedDataParallel, tier: str | None, path: str | None):
    if tier is None:
        return torch.optim.Adam(fsdp.sharded_parameters(), **ADAM)
    return OffloadOptimizer(fsdp.sharded_parameters(), tier=tier, path=path, **ADAM)


def device_state_bytes(fsdp: FullyShardedDataParallel, opt) -> dict[str, int]:
    """What the compute device holds, by kind of state, measured per storage: FSDP's chunks,
    frozen parameters and any gathered flat parameter, the chunks' gradients, and, where Adam
    runs on the device, its state. An `OffloadOptimizer`'s buffers are not on the device."""
    on_device = opt if isinstance(opt, torch.optim.Optimizer) else None
    return vars(state_bytes(fsdp, on_device).model_state())


def train_on_rank(tier: str | None, path: str | None = None) -> tuple[TrainTrace, dict]:
    """FSDP training with Adam on the device (`tier=None`) or offloaded to `tier`.

    Returns the trace and what this rank held and moved: `owned` elements (its chunks) in
    `tensors` chunks; `tiers`, bytes per tier by kind of state after the last step (the
    device measured on the model, host and disk on the optimizer); `moved_per_step` over the
    bus each way; `sent_per_step` over the network (ring model, contract gathers left out);
    `files`, the disk tier's files and sizes while it lived. The files are removed after.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    fsdp, batches, loss_fn = _fsdp()
    opt = _optimizer(fsdp, tier, path)
    with comm.record() as ledger:
        trace = train(fsdp, [shard_batch(b, rank, world) for b in batches], loss_fn, opt)
    steps = len(batches)
    empty = dict.fromkeys(STATES, 0)
    tiers = {"device": device_state_bytes(fsdp, opt), "host": empty, "disk": dict(empty)}
    info = {
        "owned": sum(p.numel() for p in fsdp.sharded_parameters()),
        "tensors": len(fsdp.sharded_parameters()),
        "tiers": tiers,
        "moved_per_step": {"device_to_host": 0.0, "host_to_device": 0.0},
        "sent_per_step": sum(r.ring_bytes for r in ledger.records if r.tag != CONTRACT_TAG) / steps,
        "files": {},
    }
    if tier is not None:
        measured = opt.tier_bytes()
        tiers["host"], tiers["disk"] = measured["host"], measured["disk"]
        info["optimizer_device"] = measured["device"]  # what the optimizer sees there
        info["moved_per_step"] = {k: v / steps for k, v in opt.moved.items()}
        info["files"] = opt.file_sizes()
        opt.close()
    return trace, info


def disk_files_on_rank(path: str, steps: int = 2) -> dict:
    """The disk tier while it lives, on this rank: FSDP's GPT trained `steps` steps with its
    Adam moments in files under `path`. Returns the directory's name, its files and sizes as
    `os.listdir` / `os.stat` see them, whether each file's bytes (read with numpy, not
    through the mapping) equal the optimizer's state, and what is left after `close()`."""
    rank, world = dist.get_rank(), dist.get_world_size()
    fsdp, batches, loss_fn = _fsdp(steps=steps)
    opt = _optimizer(fsdp, "disk", path)
    train(fsdp, [shard_batch(b, rank, world) for b in batches], loss_fn, opt)
    directory = opt.directory
    names = sorted(os.listdir(directory))
    sizes = {n: os.stat(os.path.join(directory, n)).st_size for n in names}
    on_disk = {n: np.fromfile(os.path.join(directory, n), dtype=np.float32) for n in names}
    same = {n: bool(np.array_equal(on_disk[n], opt.files[n].reshape(-1).numpy())) for n in names}
    nonzero = {n: int(np.count_nonzero(on_disk[n])) for n in names}
    opt.close()
    return {
        "directory": os.path.basename(directory),
        "sizes": sizes,
        "file_equals_state": same,
        "nonzero": nonzero,
        "owned": [p.numel() for p in fsdp.sharded_parameters()],
        "exists_after_close": os.path.exists(directory),
    }


def step_times_on_rank(tier: str | None, steps: int = 6, path: str | None = None) -> dict:
    """Median milliseconds of forward + backward and of `optimizer.step()` on this rank
    (the first step, which warms up, left out), for the wider `TIMING_GPT`."""
    rank, world = dist.get_rank(), dist.get_world_size()
    fsdp, batches, loss_fn = _fsdp(steps=steps + 1, **TIMING_GPT)
    opt = _optimizer(fsdp, tier, path)
    fwd_bwd, step = [], []
    for i, batch in enumerate(batches):
        x, y = shard_batch(batch, rank, world)
        comm.barrier(tag="timing")
        t0 = time.perf_counter()
        opt.zero_grad()
        loss_fn(fsdp(x), y).backward()
        t1 = time.perf_counter()
        opt.step()
        t2 = time.perf_counter()
        if i > 0:
            fwd_bwd.append(t1 - t0)
            step.append(t2 - t1)
    if tier is not None:
        opt.close()
    return {
        "forward_backward_ms": 1e3 * statistics.median(fwd_bwd),
        "step_ms": 1e3 * statistics.median(step),
        "owned": sum(p.numel() for p in fsdp.sharded_parameters()),
    }


def cuda_peak_bytes(tier: str | None, steps: int = 3, **sizes) -> dict | None:
    """On one GPU, without a world: the GPT trained `steps` steps with Adam on the GPU
    (`tier=None`) or an `OffloadOptimizer` (pinned host masters, non-blocking copies).
    Returns `torch.cuda.max_memory_allocated` over the steps and the trainable elements;
    None where there is no GPU."""
    if not torch.cuda.is_available():
        return None
    device = torch.device("cuda")
    model, batches, loss_fn = build("gpt", steps=steps, **{**TIMING_GPT, **sizes})
    model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    if tier is None:
        opt = torch.optim.Adam(params, **ADAM)
    else:
        opt = OffloadOptimizer(params, tier=tier, **ADAM)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = loss_fn(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    if tier is not None:
        opt.close()
    return {"peak": peak, "psi": sum(p.numel() for p in params), "losses": losses}
