"""Joining a world that torchrun (or any launcher setting its environment) already started.

There the ranks exist before `launch` is called, so `launch` starts nothing: each process
initialises the default process group from the environment (if not done yet), runs the
function and all-gathers the results, so every rank returns the list in rank order.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from .device import world_backend
from .host import on_host


def under_torchrun() -> bool:
    """True when this process was started by torchrun (or any launcher setting its env)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def _join_torchrun_world(fn, world_size, args, kwargs, backend, timeout_s, device=None) -> list:
    env_world = int(os.environ["WORLD_SIZE"])
    if world_size is not None and world_size != env_world:
        raise ValueError(
            f"launch: world_size={world_size} but torchrun started WORLD_SIZE={env_world}; "
            "pass world_size=None (or the same number) under torchrun"
        )
    if not dist.is_initialized():
        backend = world_backend(device, backend, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
        if backend == "nccl":  # LOCAL_RANK picks this process's GPU
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(
            backend,
            timeout=timedelta(seconds=timeout_s),
            store=_attempt_store(timeout_s),
            rank=int(os.environ["RANK"]),
            world_size=env_world,
        )
    result = on_host(fn(*args, **kwargs))  # CPU tensors, as `launch` returns them
    results = [None] * env_world
    dist.all_gather_object(results, result)
    return results


def _attempt_store(timeout_s: float):
    """The launcher's store, this attempt's keys apart (`TORCHELASTIC_RESTART_COUNT`).

    torchrun's agent keeps one store across `--max-restarts`: without a prefix, a restarted
    rank can read the address a dead rank published in the previous attempt and gloo's
    full-mesh connect is refused, or hangs until the timeout.
    """
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        int(os.environ["WORLD_SIZE"]),
        is_master=not agent and int(os.environ["RANK"]) == 0,
        timeout=timedelta(seconds=timeout_s),
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"minidist/attempt_{attempt}", store)
