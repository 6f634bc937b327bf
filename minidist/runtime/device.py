"""Which device each rank computes on, and the backend that goes with it.

One GPU per rank under NCCL: NCCL refuses two ranks on one GPU and moves only CUDA tensors,
so rank r of a world `launch` starts uses `cuda:r` (under torchrun, `cuda:LOCAL_RANK`).
Under gloo every rank computes on the CPU. The same rule as `torchrun --nproc-per-node`
with `torch.cuda.set_device(LOCAL_RANK)` (PyTorch's "Getting started with distributed
data parallel" tutorial).

- `world_backend(device, backend, world_size)`: the backend (and so the device) a world
  uses, from `launch`'s `device=` ("cpu", "cuda", "auto") or, as before, its `backend=`.
- `rank_device()`: this rank's device, for fixtures, notebooks and user code: `cuda:i` in
  a world under NCCL, the CPU everywhere else.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .backend import _check_backend, default_backend

DEVICES = ("cpu", "cuda", "auto")
_BACKEND_OF = {"cpu": "gloo", "cuda": "nccl"}


def world_backend(device: str | None, backend: str | None, world_size: int) -> str:
    """The backend for `device` (None: `backend`, else `default_backend(world_size)`).

    "cpu" is gloo; "cuda" is NCCL with one GPU per rank (fewer GPUs than ranks is refused,
    naming both counts); "auto" is NCCL when there are at least `world_size` GPUs, else gloo.
    """
    if device is None:
        backend = default_backend(world_size) if backend is None else backend
        _check_backend(backend, world_size, "launch: backend")
        return backend
    if device not in DEVICES:
        raise ValueError(f"launch: device must be one of {DEVICES}, got {device!r}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "auto":
        device = "cuda" if gpus >= world_size else "cpu"
    if device == "cuda" and gpus < world_size:
        raise ValueError(
            f"launch: device='cuda' needs one GPU per rank: {world_size} ranks but "
            f"{gpus} GPUs on this machine (use device='auto' to fall back to CPUs)"
        )
    wanted = _BACKEND_OF[device]
    if backend is not None and backend != wanted:
        raise ValueError(
            f"launch: device={device!r} runs on backend {wanted!r}, but backend={backend!r} "
            "was given; pass one of them"
        )
    return wanted


def rank_device() -> torch.device:
    """This rank's device: `cuda:i` in a world under NCCL (the GPU `launch` or torchrun's
    LOCAL_RANK picked), the CPU in a gloo world or outside any world."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
