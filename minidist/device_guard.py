"""A CPU-only guard for "tensors follow their module": no tensor made without naming a device.

On a GPU, a tensor that minidist creates without `device=` lands on the CPU (or on whatever
`torch.set_default_device` says) while the module and its data live on the GPU, and the
first op mixing them fails, or NCCL refuses it. On a CPU machine nothing shows, because the
default device is the right one by luck. The guard makes it show on CPUs: inside
`no_implicit_device()` every factory call (`torch.empty`, `zeros`, `ones`, `full`,
`tensor`, `arange`, `rand*`, ...) made *from minidist's own code* without a `device=`
raises, naming the file and line. It acts like `torch.set_default_device("meta")` scoped to
minidist's frames: torch's own code (an optimizer's step counters, `nn.Linear` under a
model built by the caller) is left alone, as is a factory given `device=` explicitly
(`device="cpu"` for a host tier or a reproducible generator stream is a decision, not luck).

`launch` enters the guard on every rank when the environment variable
MINIDIST_DEVICE_GUARD is "1" (the tests set it with `device_guard_env`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

_FACTORIES = frozenset(
    getattr(torch, name)
    for name in (
        "empty",
        "zeros",
        "ones",
        "full",
        "tensor",
        "arange",
        "linspace",
        "logspace",
        "eye",
        "rand",
        "randn",
        "randint",
        "randperm",
        "empty_strided",
        "scalar_tensor",
    )
)
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ENV = "MINIDIST_DEVICE_GUARD"
_reported: set[str] = set()


class ImplicitDeviceError(RuntimeError):
    """A tensor made by minidist's code without naming its device."""


class _NoImplicitDevice(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FACTORIES and kwargs.get("device") is None:
            frame = sys._getframe(1)
            path = frame.f_code.co_filename
            if path.startswith(_PACKAGE) and path != __file__:
                where = f"{os.path.relpath(path, _ROOT)}:{frame.f_lineno}"
                if os.environ.get(_ENV) == "report":  # list every site once, go on
                    if where not in _reported:
                        _reported.add(where)
                        print(f"IMPLICIT-DEVICE {where} {func.__name__}", file=sys.stderr)
                    return func(*args, **kwargs)
                raise ImplicitDeviceError(
                    f"{where}: torch.{func.__name__}(...) without device=: on a GPU this "
                    "tensor would land on the CPU, away from its module and input. Pass "
                    "device= (the module's or input's device, comm.group_device(group) for "
                    "a bookkeeping tensor, or 'cpu' where the CPU is meant)."
                )
        return func(*args, **kwargs)


@contextlib.contextmanager
def no_implicit_device() -> Iterator[None]:
    """Inside the block, a factory call from minidist's code without `device=` raises.

    Already inside one (a rank forked from a guarded process inherits its guard), it adds
    none: a second would check nothing more and run every torch call through Python again."""
    if any(isinstance(mode, _NoImplicitDevice) for mode in _get_current_function_mode_stack()):
        yield
        return
    with _NoImplicitDevice():
        yield


def guard_requested() -> bool:
    """True when MINIDIST_DEVICE_GUARD=1 asks every rank of a world to run guarded."""
    return os.environ.get(_ENV) in ("1", "report")


def rank_guard() -> contextlib.AbstractContextManager:
    """What a rank runs its function in: the guard if requested, else nothing."""
    return no_implicit_device() if guard_requested() else contextlib.nullcontext()
