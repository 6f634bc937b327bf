"""What each torch.distributed backend can move, and where a group's bookkeeping lives.

NCCL moves only CUDA tensors; gloo moves CPU tensors, and CUDA tensors only in all-reduce
and broadcast (torch.distributed's "Backends" table, docs.pytorch.org/docs/stable/
distributed.html). `minidist.comm` checks every tensor against its group's backend with
`_check_devices` before the backend sees it, so a CPU tensor sent into NCCL gets a message
naming the op, the tensor's tag, its device and the backend instead of NCCL's own.
`group_device(group)` is where a small bookkeeping tensor (a model check, a found-inf flag,
lengths, clocks) for that group must be made.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# Other backends (MPI, fake test groups) are not checked.
_GLOO_CUDA_OPS = ("all_reduce", "broadcast")
_NO_PAYLOAD = torch.empty(0, device="meta")  # the ledger's stand-in for barrier and objects


def group_backend(group=None) -> str:
    """The backend of `group` ("gloo", "nccl", ...)."""
    return str(dist.get_backend(group))


def group_device(group=None) -> torch.device:
    """Where a bookkeeping tensor of `group`'s collectives must live: this rank's GPU under
    NCCL, the CPU otherwise."""
    if group_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _check_devices(op: str, tensors, group, tag: str) -> None:
    """Refuse a tensor the group's backend cannot move, before anything is sent or recorded."""
    backend = group_backend(group)
    if backend not in ("gloo", "nccl"):
        return
    flat = [x for t in tensors for x in (t if isinstance(t, list | tuple) else [t])]
    for t in flat:  # (torch.distributed's list forms give lists of tensors)
        kind = t.device.type
        if backend == "nccl":
            ok, rule = kind == "cuda", "NCCL moves only CUDA tensors"
        else:
            ok = kind == "cpu" or (kind == "cuda" and op in _GLOO_CUDA_OPS)
            rule = f"gloo moves CPU tensors (CUDA tensors only in {', '.join(_GLOO_CUDA_OPS)})"
        if not ok:
            raise ValueError(
                f"comm.{op}: the tensor tagged {tag or '(untagged)'!r} is on {t.device}, which "
                f"backend {backend!r} cannot move: {rule}. Create it on the group's device "
                "(comm.group_device(group), or the device of the module it belongs to)."
            )
