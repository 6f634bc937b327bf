"""Downpour SGD's worker: fetch every n_fetch steps, push the accrued gradient every n_push.

Dean et al. 2012, "Large Scale Distributed Deep Networks" (NIPS), section 4.1 and the
Downpour client of their appendix: a model replica asks the parameter server for fresh
parameters every n_fetch steps and sends the gradients it accrued every n_push steps; between
fetches it steps its own copy with the same learning rate (parameters -= α·gradient), and the
servers apply each push as it arrives (`ShardServer(apply_on_arrival=True)`: no clocks, no
barrier, one optimizer step per push). A push reports the version of the last fetch, so the
server records its staleness: the pushes applied since that fetch, the worker's own ones
among them (`theory.downpour_own_staleness`, exactly the staleness when it is alone).

Here the fetch and the push are synchronous (the paper runs them in background threads) and
the servers run SGD with momentum, as in the other consistency models (the paper: Adagrad).
With n_fetch = n_push = 1 and one worker it is one-process SGD, step for step.
"""

from __future__ import annotations

import time

import torch
import torch.nn as nn

from ..data import shard_batch
from . import keys
from .worker import Worker


def check_schedule(n_fetch: int, n_push: int) -> None:
    """Raise unless n_fetch and n_push are ints >= 1."""
    for name, value in (("n_fetch", n_fetch), ("n_push", n_push)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"Downpour: {name} must be an int >= 1 (steps), got {value!r}")


def push_steps(steps: int, n_push: int) -> list[int]:
    """The steps after which a worker pushes: every n_push-th, and the last (what is left)."""
    return [t for t in range(steps) if (t + 1) % n_push == 0 or t == steps - 1]


def run_worker(
    client: Worker,
    model: nn.Module,
    batches: list,
    loss_fn,
    worker: int,
    workers: int,
    n_fetch: int,
    n_push: int,
    lr: float,
    delay_s: float = 0.0,
) -> tuple[list[float], list[list[int]], list[float]]:
    """Train this worker's slices under Downpour; returns (losses, the versions each fetch
    read, seconds per step). Ends with a pull of every worker's every push."""
    check_schedule(n_fetch, n_push)
    pushes = set(push_steps(len(batches), n_push))
    accrued = torch.zeros(
        sum(p.numel() for p in keys.trainable(model)), device=next(model.parameters()).device
    )
    losses, versions, times = [], [], []
    for step, batch in enumerate(batches):
        t0 = time.perf_counter()
        if step % n_fetch == 0:
            versions.append(client.pull(step))
        x, y = shard_batch(batch, worker, workers)
        model.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        grad = keys.flat_grads(model)
        accrued += grad
        keys.write_values(model, keys.flat_values(model) - lr * grad)  # the replica's own step
        if delay_s:
            time.sleep(delay_s)
        if step in pushes:
            client.push(step, accrued)
            accrued.zero_()
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
    client.pull(workers * len(pushes), everything=True)  # every push of every worker applied
    return losses, versions, times
