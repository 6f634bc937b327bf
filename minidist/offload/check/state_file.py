"""offload checker: exercise 2: a memory-mapped optimizer state."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

import numpy as np
import torch

from ...course.check import LearnerFailed, call_learner, fail, passed

FILE_SHAPES = [(3, 5), (7,), (2, 3, 4)]
# the parameter the state belongs to may be a 16-bit compute copy: the state stays float32
FILE_LIKE_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


_REFUSED = object()  # state_file raised FileExistsError where that is the right answer


def _call(fn: Callable, directory: str, name: str, like: torch.Tensor, refuse: bool = False):
    """`fn(directory, name, like)` with a time limit. The errors torch.from_file raises for
    the usual mistakes are named; any other exception of the learner's (their own
    ValueError, say) becomes a message saying what was raised and where, never a raw
    traceback. With `refuse`, FileExistsError is the expected answer: `_REFUSED`."""
    path = os.path.join(directory, name)
    n = like.numel()
    seen: list[RuntimeError] = []

    def run():
        try:
            return fn(directory, name, like)
        except FileExistsError:
            if refuse:
                return _REFUSED
            raise
        except RuntimeError as exc:
            seen.append(exc)
            raise

    what = f"state_file(directory, {name!r}, like {tuple(like.shape)})"
    try:
        return call_learner(run, what=what)
    except LearnerFailed as exc:
        failed = exc
        if not seen:
            raise
        text = str(seen[0])
    if "read-only mode" in text or "smaller than the required mapping" in text:
        fail(
            f"torch.from_file could not map {name}: with shared=False it opens the file "
            "read-only and maps a private copy of what is already there, so it needs an "
            "existing file of the full size and never writes to it. shared=True creates "
            "the file, grows it to size × 4 bytes (zeros) and sends every write to it."
        )
    if "is invalid for input of size" in text and os.path.exists(path):
        got = os.path.getsize(path)
        if got == 16 * n:
            fail(
                f"{name} has {got} bytes for a {tuple(like.shape)} state of {n} "
                "elements: torch.from_file's `size` counts elements of `dtype`, not "
                f"bytes: size={n} gives a file of 4 × {n} = {4 * n} bytes."
            )
        fail(
            f"{name} has {got} bytes; a float32 state shaped like {tuple(like.shape)} "
            f"has {n} elements, 4 × {n} = {4 * n} bytes: size=like.numel()."
        )
    raise failed


def _diagnose_fresh(fn: Callable, directory: str, shape: tuple[int, ...], i: int) -> None:
    like = torch.empty(shape, dtype=FILE_LIKE_DTYPES[i % len(FILE_LIKE_DTYPES)], device="cpu")
    name = f"{i}.exp_avg"
    path = os.path.join(directory, name)
    n = like.numel()
    t = _call(fn, directory, name, like)
    if not isinstance(t, torch.Tensor):
        fail(f"state_file returned a {type(t).__name__}; return the mapped tensor.")
    if not os.path.exists(path):
        fail(
            f"there is no file {name} in the directory after state_file ran: map the file "
            "at os.path.join(directory, name) (torch.from_file(path, shared=True, ...) "
            "creates it)."
        )
    size = os.path.getsize(path)
    if size != 4 * n and t.dtype == like.dtype != torch.float32:
        fail(
            f"{name} has {size} bytes, {like.element_size()} per element: the state is "
            f"{t.dtype} for a {like.dtype} parameter shaped {tuple(shape)} (you took like's "
            "dtype). Adam's moments are float32 whatever the parameter's dtype: "
            "dtype=torch.float32, 4 bytes per element."
        )
    if size != 4 * n:
        how = (
            " `size` counts elements of `dtype`, not bytes."
            if size == 16 * n
            else " size=like.numel(), dtype=torch.float32."
        )
        fail(
            f"{name} has {size} bytes; a float32 state shaped like {tuple(shape)} has {n} "
            f"elements, 4 × {n} = {4 * n} bytes.{how}"
        )
    if t.dtype != torch.float32:
        fail(
            f"the state is {t.dtype} for a {like.dtype} parameter shaped {tuple(shape)}: "
            "Adam's moments are float32 whatever the parameter's dtype (dtype=torch.float32)."
        )
    if tuple(t.shape) != tuple(shape):
        fail(
            f"the state has shape {tuple(t.shape)}; Adam needs it shaped like the parameter, "
            f"{tuple(shape)}: .view(like.shape) keeps the mapping."
        )
    if t.any():
        fail("a fresh state must start at zeros (a new file, grown by from_file, reads zeros).")
    values = torch.arange(1, n + 1, dtype=torch.float32, device="cpu").reshape(shape)
    t.copy_(values)  # what Adam does to exp_avg, in place
    on_disk = np.fromfile(path, dtype=np.float32)
    if not np.array_equal(on_disk, values.reshape(-1).numpy()):
        fail(
            f"values written into the returned tensor are not in {name} (the file still "
            "reads zeros): the tensor is not backed by the file. torch.from_file(..., "
            "shared=False) maps it copy-on-write, a private copy whose writes never reach the "
            "file; a .clone() or .to() of the mapping is a copy too. Use shared=True and "
            "return the mapped tensor (a view of it)."
        )


def _diagnose_existing(fn: Callable, directory: str) -> None:
    like = torch.empty(4, 3, device="cpu")
    name = "0.exp_avg_sq"
    path = os.path.join(directory, name)
    other = np.full(2 * like.numel(), 0.25, dtype=np.float32)  # another model's state
    other.tofile(path)
    t = _call(fn, directory, name, like, refuse=True)
    t = None if t is _REFUSED else t
    on_disk = np.fromfile(path, dtype=np.float32) if os.path.exists(path) else None
    untouched = on_disk is not None and np.array_equal(on_disk, other)
    if t is None:
        if not untouched:
            fail(
                f"{name} existed (another model's state) and you raised FileExistsError, but "
                "only after changing the file: check before touching it (open(path, 'xb') "
                "fails without opening an existing file)."
            )
        return
    if isinstance(t, torch.Tensor) and t.numel() and bool((t == 0.25).all()):
        fail(
            f"{name} already existed, holding another model's state ({other.size} values), "
            "and you mapped it: your Adam would start from another model's moments. Refuse "
            "an existing file: open(path, 'xb').close() raises FileExistsError when it "
            "exists, then map the new, empty file."
        )
    if not untouched:
        fail(
            f"{name} already existed (another model's state, {other.nbytes} bytes) and you "
            "overwrote it: that may be the live state of another run, two optimizers mapping "
            "one file write into each other's moments. Refuse it: raise FileExistsError "
            "(open(path, 'xb') does) and leave the file alone."
        )
    fail(
        f"{name} already existed and state_file returned without an error: raise "
        "FileExistsError for an existing file (open(path, 'xb') does)."
    )


def check_state_file(state_file: Callable) -> None:
    """Call `state_file(directory, name, like)` on fresh temporary directories."""
    with tempfile.TemporaryDirectory(prefix="minidist-check-") as directory:
        for i, shape in enumerate(FILE_SHAPES):
            _diagnose_fresh(state_file, directory, shape, i)
    with tempfile.TemporaryDirectory(prefix="minidist-check-") as directory:
        _diagnose_existing(state_file, directory)
    passed(
        "state_file maps a new float32 file of 4 bytes per element, zeros, shared: what is "
        "written to the tensor is in the file; an existing file (another model's state) is "
        "refused and left as it was"
    )
