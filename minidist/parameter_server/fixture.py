"""The rank function the tests, notebook 12 and the tour run, and its reference.

`train_on_rank(servers, workers, consistency, staleness, ...)` runs on every rank of a world
of S + W: ranks below S serve their key range of `build(name)`'s trainable parameters,
the others train on their slice of each global batch (the data-parallel fixture's model and
batches, so BSP can be compared with one process and with all-reduce data parallelism).
Consistency "bsp", "ssp" (with `staleness`), "async" or "downpour" (`downpour.py`, with
`n_fetch` and `n_push`); `cache_prefetch` puts a worker's model behind GeePS's cache.
`reference` is one process training the same model on the whole batches with the same SGD.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .. import comm
from ..data import shard_batch
from ..data_parallel.fixture import STEPS, build
from ..memory import optimizer_state_tensors, tensor_bytes
from ..parallel import named_parameters
from ..training import TrainTrace, make_optimizer, train
from . import downpour, keys
from .cache import CacheEvent, ParameterCache
from .server import AppliedGradient, ShardServer
from .worker import Worker

CONSISTENCY = ("bsp", "ssp", "async", "downpour")


def staleness_bound(consistency: str, staleness: int | None = None) -> int | None:
    """s of the consistency model: 0 for BSP, `staleness` for SSP, None (∞) for async and
    Downpour."""
    if consistency not in CONSISTENCY:
        raise ValueError(f"consistency must be one of {CONSISTENCY}, got {consistency!r}")
    if consistency == "ssp":
        if not isinstance(staleness, int) or staleness < 0:
            raise ValueError(f"consistency='ssp' needs staleness >= 0, got staleness={staleness!r}")
        return staleness
    if staleness is not None:
        raise ValueError(f"staleness={staleness!r} is only for consistency='ssp'")
    return 0 if consistency == "bsp" else None


@dataclass
class ServerResult:
    server: int
    key_range: tuple[int, int]
    values: torch.Tensor
    last_update: torch.Tensor | None
    applied: list[AppliedGradient]
    ledger: comm.Ledger
    state_bytes: int = 0  # measured: the shard's values, their gradient, the momentum buffer


@dataclass
class WorkerResult:
    worker: int
    losses: list[float]
    read_versions: list[list[int]]  # per clock, the version each server answered with
    params: dict[str, torch.Tensor]  # after the final pull (every update in)
    ledger: comm.Ledger
    step_times: list[float] = field(default_factory=list)
    cache_events: list[CacheEvent] = field(default_factory=list)  # GeePS's cache, if used
    cache_moved_out: int = 0  # gradient bytes the cache moved device -> host


def train_on_rank(
    servers: int,
    workers: int,
    consistency: str = "bsp",
    staleness: int | None = None,
    name: str = "mlp",
    steps: int = STEPS,
    global_batch: int = 8,
    delay_s: dict[int, float] | None = None,
    fail_worker_at: tuple[int, int] | None = None,
    lr: float = 0.05,
    momentum: float = 0.9,
    n_fetch: int = 1,
    n_push: int = 1,
    cache_prefetch: int | None = None,
) -> ServerResult | WorkerResult:
    """On a rank: serve or train. `delay_s` {worker: seconds} slows workers down each step;
    `fail_worker_at` (worker, clock) makes that worker raise there (a test of failure);
    `n_fetch`, `n_push`: Downpour's schedule (`downpour.py`), for consistency="downpour";
    `cache_prefetch` p: a worker computes through GeePS's cache (`cache.py`) of its model's
    layers, p layers prefetched (BSP, SSP, async)."""
    keys.check_roles(dist.get_world_size(), servers, workers)
    bound = staleness_bound(consistency, staleness)
    downpour.check_schedule(n_fetch, n_push)
    if cache_prefetch is not None and consistency == "downpour":
        raise ValueError(
            "cache_prefetch is for consistency 'bsp', 'ssp' or 'async', not 'downpour'"
        )
    rank = dist.get_rank()
    model, batches, loss_fn = build(name, steps=steps, global_batch=global_batch)
    psi = sum(p.numel() for p in keys.trainable(model))
    ranges = keys.key_ranges(psi, servers)
    worker_ranks = list(range(servers, servers + workers))
    if rank < servers:
        start, stop = ranges[rank]
        shard = ShardServer(
            keys.flat_values(model)[start:stop],
            worker_ranks,
            bound,
            lr=lr,
            momentum=momentum,
            apply_on_arrival=consistency == "downpour",
        )
        with comm.record() as ledger:
            shard.serve()
        state = [shard.param, *optimizer_state_tensors(shard.optimizer)]
        if shard.param.grad is not None:
            state.append(shard.param.grad)
        return ServerResult(
            rank,
            ranges[rank],
            shard.param.detach().clone(),
            shard.last_update,
            shard.applied,
            ledger,
            tensor_bytes(state),
        )
    w = rank - servers
    client = Worker(model, list(range(servers)), ranges)
    cache = None if cache_prefetch is None else ParameterCache(model.layers, cache_prefetch)
    losses, versions, times = [], [], []
    if consistency == "downpour":
        with comm.record() as ledger:
            losses, versions, times = downpour.run_worker(
                client,
                model,
                batches,
                loss_fn,
                w,
                workers,
                n_fetch,
                n_push,
                lr,
                (delay_s or {}).get(w, 0.0),
            )
            client.done()
        return WorkerResult(w, losses, versions, named_parameters(model), ledger, times)
    with comm.record() as ledger:
        for clock, batch in enumerate(batches):
            t0 = time.perf_counter()
            versions.append(client.pull(clock))
            x, y = shard_batch(batch, w, workers)
            model.zero_grad()
            with cache.step() if cache else nullcontext():
                loss = loss_fn(model(x), y)
                loss.backward()
            if fail_worker_at == (w, clock):
                raise RuntimeError(f"worker {w} failed at clock {clock} (as asked)")
            if delay_s and w in delay_s:
                time.sleep(delay_s[w])
            client.push(clock)
            losses.append(loss.item())
            times.append(time.perf_counter() - t0)
        client.pull(len(batches), everything=True)
        client.done()
    result = WorkerResult(w, losses, versions, named_parameters(model), ledger, times)
    if cache:
        result.cache_events, result.cache_moved_out = cache.events, cache.moved_out
    return result


def reference(
    name: str = "mlp", steps: int = STEPS, global_batch: int = 8, lr: float = 0.05
) -> TrainTrace:
    """One process, the whole global batches, SGD with momentum 0.9 (the servers' optimizer)."""
    model, batches, loss_fn = build(name, steps=steps, global_batch=global_batch)
    return train(model, batches, loss_fn, make_optimizer(model.parameters(), "sgd", lr=lr))


def assemble(results: list) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the Ψ keys' values, the last averaged gradient) from the servers' results."""
    served = [r for r in results if isinstance(r, ServerResult)]
    values = torch.cat([r.values for r in served])
    updates = [r.last_update for r in served]
    return values, (None if any(u is None for u in updates) else torch.cat(updates))
