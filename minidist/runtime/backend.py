"""Which backend a world uses (gloo or NCCL) and how its ranks are started (fork or spawn).

`default_backend` and `start_method_for` are the public answers; `launch` checks a backend
it is given with `_check_backend` and picks its start method with `_pick_start_method`.
"""

from __future__ import annotations

import os
import sys

import torch

_BACKENDS = ("gloo", "nccl")


def default_backend(world_size: int) -> str:
    """gloo, unless the environment variable MINIDIST_BACKEND says "nccl".

    The course's techniques keep their tensors on the CPU, which only gloo can send, so NCCL
    is opt-in (`launch(..., backend="nccl")` or MINIDIST_BACKEND=nccl) for code that puts its
    tensors on the ranks' GPUs; picking it whenever GPUs exist would break every lesson on a
    machine with several GPUs. `world_size` is checked against the GPUs when NCCL is chosen.
    """
    backend = os.environ.get("MINIDIST_BACKEND", "gloo")
    _check_backend(backend, world_size, "MINIDIST_BACKEND")
    return backend


def _check_backend(backend: str, world_size: int, name: str) -> None:
    """A known backend, and for NCCL one GPU per rank; `name` says where the value came from."""
    if backend not in _BACKENDS:
        raise ValueError(f"{name} must be one of {_BACKENDS}, got {backend!r}")
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(
            f"{name}='nccl' needs one GPU per rank: world_size={world_size}, "
            f"GPUs={torch.cuda.device_count()}"
        )


def start_method_for(backend: str | None = None, world_size: int = 1) -> str:
    """The start method `launch` would use by default (fork or spawn)."""
    return _pick_start_method(None, backend or default_backend(world_size), None)


START_METHODS = ("fork", "spawn")


def _check_threads(threads) -> None:
    """`threads_per_rank`: None (the default) or an int from 1 to this machine's cores."""
    if threads is None:
        return
    cores = os.cpu_count() or 1
    if not isinstance(threads, int) or isinstance(threads, bool) or not 1 <= threads <= cores:
        raise ValueError(
            f"launch: threads_per_rank must be None or an int from 1 to the {cores} cores of "
            f"this machine, got {threads!r}"
        )


def _pick_start_method(start_method: str | None, backend: str, threads: int | None) -> str:
    """Fork where it is safe: Linux, gloo, no CUDA in the parent, one intra-op thread.

    A forked child must not start a thread team of its own: torch's CPU build parallelises
    with GNU OpenMP, which hangs in a forked child of a parent that already ran a parallel
    region (any torch op on a tensor big enough). So forked ranks use one intra-op thread,
    and asking for more means spawn.
    """
    _check_threads(threads)
    if start_method is not None:
        if start_method not in START_METHODS:
            raise ValueError(
                f"launch: start_method must be 'fork', 'spawn' or None (the default), got "
                f"{start_method!r} (not 'forkserver': its ranks are no children of the "
                "launching process, which must stop them and which they must die with)"
            )
        if start_method == "fork" and threads is not None and threads > 1:
            raise ValueError(
                f"launch: threads_per_rank={threads} needs start_method='spawn': a forked rank "
                "with several intra-op threads can hang (OpenMP after fork)"
            )
        return start_method
    if threads is not None and threads > 1:
        return "spawn"
    if sys.platform == "linux" and backend == "gloo" and not torch.cuda.is_initialized():
        return "fork"
    return "spawn"
