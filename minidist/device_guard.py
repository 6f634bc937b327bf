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
Inside the block the factories on the `torch` module are checking wrappers; every other
torch call runs untouched (a `TorchFunctionMode` would run each of them through Python).

`launch` enters the guard on every rank when the environment variable
MINIDIST_DEVICE_GUARD is "1" (the tests set it with `device_guard_env`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator

import torch

_FACTORIES = (
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
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ENV = "MINIDIST_DEVICE_GUARD"
_reported: set[str] = set()


class ImplicitDeviceError(RuntimeError):
    """A tensor made by minidist's code without naming its device."""


def _checked(func: Callable) -> Callable:
    """`func` (a torch factory) refusing a call from minidist's code without `device=`."""

    @functools.wraps(func)
    def factory(*args, **kwargs):
        if kwargs.get("device") is None:
            frame = sys._getframe(1)
            path = frame.f_code.co_filename
            if path.startswith(_PACKAGE) and path != __file__:
                where = f"{os.path.relpath(path, _ROOT)}:{frame.f_lineno}"
                if os.environ.get(_ENV) != "report":
                    raise ImplicitDeviceError(
                        f"{where}: torch.{func.__name__}(...) without device=: on a GPU this "
                        "tensor would land on the CPU, away from its module and input. Pass "
                        "device= (the module's or input's device, comm.group_device(group) "
                        "for a bookkeeping tensor, or 'cpu' where the CPU is meant)."
                    )
                if where not in _reported:  # report: list every site once, go on
                    _reported.add(where)
                    print(f"IMPLICIT-DEVICE {where} {func.__name__}", file=sys.stderr)
        return func(*args, **kwargs)

    return factory


_depth = 0  # how many no_implicit_device blocks are open in this process


@contextlib.contextmanager
def no_implicit_device() -> Iterator[None]:
    """Inside the block, a factory call from minidist's code without `device=` raises.

    Blocks nest (a rank forked from a guarded process inherits its guard): the outermost
    swaps the factories in and puts back what it found."""
    global _depth
    saved = {name: getattr(torch, name) for name in _FACTORIES} if _depth == 0 else {}
    for name, func in saved.items():
        setattr(torch, name, _checked(func))
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        for name, func in saved.items():
            setattr(torch, name, func)


def guard_requested() -> bool:
    """True when MINIDIST_DEVICE_GUARD=1 asks every rank of a world to run guarded."""
    return os.environ.get(_ENV) in ("1", "report")


def rank_guard() -> contextlib.AbstractContextManager:
    """What a rank runs its function in: the guard if requested, else nothing."""
    return no_implicit_device() if guard_requested() else contextlib.nullcontext()
