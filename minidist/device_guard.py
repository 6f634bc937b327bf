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

How: while the guard is on, those factories on the `torch` module are wrappers that look at
their caller; every other torch call runs untouched (a TorchFunctionMode, which would see
them all, made a small model's step 1.4 times as long). A factory reached another way
(`torch._C._VariableFunctions`, a name imported before the guard) is not seen:
`tests/test_device_guard.py` also reads every call in the package's source.

`launch` enters the guard on every rank when the environment variable
MINIDIST_DEVICE_GUARD is "1" (the tests set it in `tests/conftest.py`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from collections.abc import Iterator

import torch
import torch.jit._builtins
import torch.utils._device

FACTORIES = (  # what the guard wraps; the static scan of the tests reads the same
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
_lock = threading.Lock()
_depth = 0  # guards open in this process; a forked rank inherits them, with the wrappers


class ImplicitDeviceError(RuntimeError):
    """A tensor made by minidist's code without naming its device."""


def _check(name: str, kwargs: dict) -> None:
    if kwargs.get("device") is not None:
        return
    frame = sys._getframe(2)
    path = frame.f_code.co_filename
    if not path.startswith(_PACKAGE) or path == __file__:
        return  # torch's own code, or the caller's: left alone
    if torch.get_default_device().type != "cpu":
        return  # a `with torch.device(...)` around the call names it
    where = f"{os.path.relpath(path, _ROOT)}:{frame.f_lineno}"
    if os.environ.get(_ENV) == "report":  # list every site once, go on
        if where not in _reported:
            _reported.add(where)
            print(f"IMPLICIT-DEVICE {where} {name}", file=sys.stderr)
        return
    raise ImplicitDeviceError(
        f"{where}: torch.{name}(...) without device=: on a GPU this tensor would land on "
        "the CPU, away from its module and input. Pass device= (the module's or input's "
        "device, comm.group_device(group) for a bookkeeping tensor, or 'cpu' where the CPU "
        "is meant)."
    )


def _guarded(name: str, factory):
    @functools.wraps(factory)
    def guarded(*args, **kwargs):
        _check(name, kwargs)
        return factory(*args, **kwargs)

    return guarded


_ORIGINAL = {name: getattr(torch, name) for name in FACTORIES}
_GUARDED = {name: _guarded(name, factory) for name, factory in _ORIGINAL.items()}


def _swap_in() -> None:
    """Put the wrappers on the `torch` module, torch's caches told first."""
    # `with torch.device(...)` knows the factories by the set it caches on first use: the
    # real ones, cached before they are swapped (else every factory under
    # torch.device("meta") would allocate for real)
    getattr(torch.utils._device, "_device_constructors", lambda: None)()
    for name, factory in _GUARDED.items():
        # TorchScript, compiling torch's own scripted code (`torch.distributed.optim`) while
        # the guard is on, resolves `torch.zeros` to the wrapper: it is the same aten op
        torch.jit._builtins._register_builtin(factory, f"aten::{name}")
        setattr(torch, name, factory)


def guarded() -> bool:
    """True while the guard is on in this process (entered here, or inherited by a fork)."""
    return _depth > 0


@contextlib.contextmanager
def no_implicit_device() -> Iterator[None]:
    """Inside the block, a factory call from minidist's code without `device=` raises.

    Guards nest (only the outermost swaps the factories), and a rank forked inside one
    runs under it: entering another there wraps nothing twice."""
    global _depth
    with _lock:
        if _depth == 0:
            _swap_in()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for name, factory in _ORIGINAL.items():
                    setattr(torch, name, factory)


def guard_requested() -> bool:
    """True when MINIDIST_DEVICE_GUARD=1 asks every rank of a world to run guarded."""
    return os.environ.get(_ENV) in ("1", "report")


def rank_guard() -> contextlib.AbstractContextManager:
    """What a rank runs its function in: the guard if requested, else nothing."""
    return no_implicit_device() if guard_requested() else contextlib.nullcontext()
