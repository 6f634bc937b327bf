"""The parent side of a world: start the ranks, collect their results, leave no process behind.

`launch` checks its arguments, picks the start method (`backend._pick_start_method`), gives
each rank a result pipe and a stderr pipe, starts the ranks on `rank._rank_main`, waits in
`collect._collect` and, whatever happens (Ctrl-C included), terminates every rank still
running (`_reap`) and removes the world's rendezvous folder. A parent killed by SIGKILL
cannot clean up: its ranks die with it (`rank._die_with_parent`) and the next `launch`
sweeps its folders (`_sweep_stale`: named after the dead parent's pid).

Under spawn the function travels by value with cloudpickle (`_ship`), which is what lets a
function defined in a notebook cell run in a fresh interpreter; `_main_module_hidden` keeps
spawned ranks from re-running the caller's `__main__`.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import math
import multiprocessing as mp
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import cloudpickle

from . import cuda_memory
from .backend import _pick_start_method
from .board import create_board
from .collect import CpuLimits, _collect
from .device import world_backend
from .rank import _rank_main
from .stderr import _StderrTail
from .torchrun import _join_torchrun_world, under_torchrun


def _ship(fn: Callable, args: tuple, kwargs: dict) -> bytes:
    try:
        return cloudpickle.dumps((fn, args, kwargs))
    except Exception as exc:
        name = getattr(fn, "__qualname__", repr(fn))
        raise TypeError(
            f"launch: fn={name} (or its args) cannot be pickled to send to spawned ranks: "
            f"{type(exc).__name__}: {exc}. Under start_method='spawn' each rank is a fresh "
            "interpreter, so fn and everything it captures must be picklable. Move "
            "unpicklable objects (open files, locks, CUDA tensors, process groups) inside fn "
            "and create them on each rank, or define fn in an importable module."
        ) from exc


@contextlib.contextmanager
def _main_module_hidden(hide: bool):
    """Stop spawned ranks from re-running the caller's `__main__`.

    multiprocessing's spawn re-imports the main script in every child so that functions
    defined there can be found by name. minidist ships `fn` by value instead, so the
    re-import is unneeded, and in a script without an `if __name__ == "__main__"` guard it
    would start the whole world again inside each rank.
    """
    main = sys.modules.get("__main__")
    if not hide or main is None:
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__spec__ = None
    main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        main.__dict__.update(saved)


def launch(
    fn: Callable[..., Any],
    world_size: int | None,
    *args: Any,
    backend: str | None = None,
    device: str | None = None,
    timeout_s: float = 120.0,
    start_method: str | None = None,
    threads_per_rank: int | None = None,
    idle_s: float | None = None,
    cpu_s: float | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Run `fn(*args, **kwargs)` on every rank of a new world; return results in rank order.

    Args:
        fn: the function each rank runs; it sees an initialised default process group
            (`dist.get_rank()`, `dist.get_world_size()`).
        world_size: number of processes (ranks) to start; refused before any starts
            where this machine cannot hold them (`_check_world_fits`).
        backend: "gloo" or "nccl"; default `default_backend(world_size)`: gloo unless the
            environment variable MINIDIST_BACKEND says "nccl".
        device: "cpu" (gloo), "cuda" (NCCL, rank r on `cuda:r`; fewer GPUs than ranks is
            refused) or "auto" (CUDA when there are at least `world_size` GPUs, else CPUs);
            default: the device of `backend`. `minidist.rank_device()` tells a rank its own.
            Whatever device a rank computes on, the tensors its result holds come back on the
            CPU (`host.py`).
        timeout_s: the whole world is stopped after this many seconds, at most a week
            (under torchrun, where nothing can be stopped, it is the timeout of every
            collective).
        idle_s: also stop it once its running ranks have together used no CPU for this
            many seconds: all of them waiting, as ranks inside a collective that never
            completes do. Unlike `timeout_s`, a loaded machine does not make a healthy world
            look like this (ignored under torchrun).
        cpu_s: also stop it once one rank has used this many seconds of CPU time (a loop
            that never ends); where CPU time cannot be read (no /proc, no psutil), this
            many seconds of wall clock (ignored under torchrun).
        start_method: "fork" or "spawn"; default fork where it is safe, spawn otherwise.
        threads_per_rank: torch intra-op threads per rank, 1 to the machine's cores (default:
            1 under fork, else cores / world_size); more than 1 selects spawn (see
            `_pick_start_method`).
    """
    _check_fn(fn)
    number = isinstance(timeout_s, (int, float)) and not isinstance(timeout_s, bool)
    if not (number and math.isfinite(timeout_s) and 0 < timeout_s <= MAX_TIMEOUT_S):
        raise ValueError(
            f"launch: timeout_s must be > 0 and finite, at most {MAX_TIMEOUT_S:.0f} (seconds, "
            f"a week), got {timeout_s!r}"
        )
    if under_torchrun():
        return _join_torchrun_world(fn, world_size, args, kwargs, backend, timeout_s, device)
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"launch: world_size must be a positive int, got {world_size!r}")
    _check_world_fits(world_size)
    for name, limit in (("idle_s", idle_s), ("cpu_s", cpu_s)):
        number = isinstance(limit, (int, float)) and not isinstance(limit, bool)
        if limit is not None and not (number and math.isfinite(limit) and limit > 0):
            raise ValueError(
                f"launch: {name} must be None or > 0 and finite (seconds), got {limit!r}"
            )
    limits = CpuLimits(idle_s, cpu_s) if idle_s is not None or cpu_s is not None else None
    backend = world_backend(device, backend, world_size)
    method = _pick_start_method(start_method, backend, threads_per_rank)
    if method == "fork":
        # Importing it is what makes a process's first torch optimizer slow (~1 s, and N
        # times that when N forked ranks each do it at once on a small machine): once here.
        importlib.import_module("torch._dynamo")
    if mp.current_process().daemon:
        raise RuntimeError(
            "launch: called inside a rank of another world (a rank is a daemonic process, "
            "which cannot start processes of its own); a rank already is in a world: use "
            "its process group, or subgroups (dist.new_group), instead of a nested launch"
        )
    payload = _ship(fn, args, kwargs) if method != "fork" else (fn, args, kwargs)
    _sweep_stale()
    procs, conns, errs = [], [], []
    folder = tempfile.mkdtemp(prefix=f"minidist-{os.getpid()}-")
    try:
        return _run_world(
            payload,
            world_size,
            backend,
            method,
            timeout_s,
            threads_per_rank,
            folder,
            procs,
            conns,
            errs,
            limits,
        )
    finally:
        _clean_up(procs, conns, errs, folder)


# Past this a wait's timeout overflows (poll(2) counts int milliseconds: 24.8 days) and so,
# much further, do a collective's (a timedelta, C++ nanoseconds): 1e9 raised OverflowError
# in the parent only once the ranks had started.
MAX_TIMEOUT_S = 7 * 24 * 3600.0


def _check_fn(fn) -> None:
    """`fn` is something a rank can call and whose return value it can send back: not a
    coroutine or generator function, whose call returns an object that never runs there."""
    if not callable(fn):
        raise TypeError(f"launch: fn must be callable (each rank calls fn(*args)), got {fn!r}")
    name = getattr(fn, "__qualname__", repr(fn))
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(
            f"launch: fn={name} is an async function: a rank calls fn and sends back what it "
            "returns, here a coroutine that never runs; pass a plain function, e.g. "
            "`lambda *a: asyncio.run(fn(*a))`"
        )
    if inspect.isgeneratorfunction(fn):
        raise TypeError(
            f"launch: fn={name} is a generator function: a rank calls fn and sends back what "
            "it returns, here a generator that cannot leave the rank; return a list instead "
            "(`lambda *a: list(fn(*a))`)"
        )


# What a forked rank holds of its own at least: 5 MB private after a gloo all-reduce
# (measured, /proc/self/smaps_rollup), plus its page tables and socket buffers.
RANK_BYTES = 8 << 20


def _available_bytes() -> int | None:
    """The memory this machine can still give (MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _check_world_fits(world_size: int) -> None:
    """A world of this many local processes can start, by arithmetic, before any does:
    each rank holds a socket to every peer (gloo's full mesh) and RANK_BYTES of its own.
    `launch(fn, 100000)` forked until the machine ran out of processes or memory."""
    import resource

    files, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if files != resource.RLIM_INFINITY and world_size > files:
        raise ValueError(
            f"launch: world_size={world_size} ranks each hold a socket to every peer, more "
            f"than a process may open here (ulimit -n {files})"
        )
    available = _available_bytes()
    if available is not None and world_size * RANK_BYTES > available:
        raise ValueError(
            f"launch: world_size={world_size} local processes need at least "
            f"{world_size * RANK_BYTES / 2**30:.3g} GiB ({RANK_BYTES >> 20} MiB each), more "
            f"than this machine has available ({available / 2**30:.3g} GiB)"
        )


def _run_world(
    payload,
    world_size,
    backend,
    method,
    timeout_s,
    threads_per_rank,
    folder,
    procs,
    conns,
    errs,
    limits=None,
) -> list[Any]:
    """Start the ranks (appending to `procs`, `conns`, `errs`) and collect their results."""
    create_board(os.path.join(folder, "board"), world_size)
    cfg = {
        "store_path": os.path.join(folder, "store"),
        "board_path": os.path.join(folder, "board"),
        "parent_pid": os.getpid(),
        "backend": backend,
        "timeout_s": timeout_s,
        "threads": threads_per_rank
        or (1 if method == "fork" else max(1, (os.cpu_count() or 1) // world_size)),
        "cuda_peak": cuda_memory.wanted(backend),
    }
    ctx = mp.get_context(method)
    with _main_module_hidden(method == "spawn"):
        for rank in range(world_size):
            recv_end, send_end = ctx.Pipe(duplex=False)
            conns.append(recv_end)
            err_recv, err_send = ctx.Pipe(duplex=False)
            errs.append(_StderrTail(err_recv))
            try:
                p = ctx.Process(
                    target=_rank_main,
                    args=(payload, rank, world_size, cfg, send_end, err_send),
                    name=f"minidist-rank{rank}",
                    daemon=True,
                )
                p.start()
            finally:
                send_end.close()
                err_send.close()
            procs.append(p)
    peaks = [None] * world_size if cfg["cuda_peak"] else None
    results = _collect(procs, conns, errs, timeout_s, cfg["board_path"], peaks, limits)
    if peaks is not None:
        cuda_memory.record(peaks)
    return results


def _clean_up(procs, conns, errs, folder: str) -> None:
    """Stop every rank still running, forward their last stderr, close the pipes, remove the
    world's folder: each step to its end even when Ctrl-C is pressed again meanwhile (a
    second interrupt while ranks are asked to stop kills them instead of waiting); the
    interrupt is raised once everything is clean."""
    pending: BaseException | None = None
    steps = [
        lambda: _reap(procs, patient=pending is None),
        *[e.drain for e in errs],
        *[e.close for e in errs],
        *[c.close for c in conns],
        lambda: shutil.rmtree(folder, ignore_errors=True),
    ]
    for step in steps:
        while True:
            try:
                step()
                break
            except KeyboardInterrupt as exc:
                pending = exc
    if pending is not None:
        raise pending


def _reap(procs, patient: bool = True) -> None:
    """SIGTERM every rank still running, wait up to 3 s, SIGKILL the rest (at once when not
    `patient`: the user interrupted again while we waited), then every process a rank
    started and left running (its process group)."""
    if patient:
        for p in procs:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + 3.0
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    # What the ranks started (a subprocess, an os.fork) is in the rank's process group
    # (`rank._rank_main`): killed with it. The group's id, the rank's pid, stays taken while
    # the group has a member, so this reaches no stranger's group.
    for p in procs:
        if p.pid is not None:
            with contextlib.suppress(OSError):
                os.killpg(p.pid, signal.SIGKILL)


_STALE = re.compile(r"^minidist-(?:offload-)?(\d+)-")
WHERE = ".where"  # a marker in the temporary folder naming a folder made elsewhere


def remember_folder(directory: str) -> str:
    """Leave a marker in the temporary folder naming `directory` (a folder this process made
    outside it, e.g. disk offload under a `path=` of the caller's), so that a launch after
    this process is killed sweeps it too; returns the marker's path (remove it with the
    folder). The folder's name must carry this process's pid, as `_sweep_stale` checks."""
    pid = os.getpid()
    if not _STALE.match(os.path.basename(directory)) or _pid_of(directory) != pid:
        raise ValueError(f"remember_folder: {directory!r} is not named minidist-...-{pid}-...")
    fd, marker = tempfile.mkstemp(prefix=f"minidist-{pid}-", suffix=WHERE)
    with os.fdopen(fd, "w") as f:
        f.write(os.path.abspath(directory))
    return marker


def _pid_of(path: str) -> int | None:
    m = _STALE.match(os.path.basename(path))
    return int(m.group(1)) if m else None


def _sweep_stale() -> None:
    """Remove the folders (rendezvous, disk-offload files) of minidist processes that died
    without cleaning up (killed by SIGKILL): named `minidist-[offload-]<pid>-...`, in the
    temporary folder or named by a marker there (`remember_folder`). A marker is followed
    only to a folder whose own name carries the same dead pid: never anything else."""
    base = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            pid = _pid_of(name)
            if pid is None or pid == os.getpid() or _alive(pid):
                continue
            path = os.path.join(base, name)
            if name.endswith(WHERE) and os.path.isfile(path):
                with contextlib.suppress(OSError), open(path) as f:
                    target = f.read().strip()
                    if _pid_of(target) == pid and os.path.isdir(target):
                        shutil.rmtree(target, ignore_errors=True)
                with contextlib.suppress(OSError):
                    os.remove(path)
            else:
                shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
