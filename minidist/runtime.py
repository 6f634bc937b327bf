"""A world of real processes: start N ranks, run a function on each, collect the results.

`launch(fn, world_size, *args)` starts `world_size` processes on this machine, initialises
the default `torch.distributed` process group in each (gloo; NCCL on request, for tensors
on the ranks' GPUs), runs `fn(*args)` on every rank and returns the per-rank return values in rank
order. Under `torchrun` the same call joins the world torchrun started instead.

How the pieces fit:
- Rendezvous: each world meets in a `FileStore` in a fresh temporary folder, so worlds never
  race for a port. (A `TCPStore` served from a thread of the parent is not safe here: a
  rank forked while that thread holds a lock can deadlock in rendezvous.) Gloo ranks then
  pass a barrier, so that none runs `fn` and exits while a peer is still connecting to it.
- Start method: fork where it is safe (Linux, CUDA not initialised in the parent), else
  spawn. Under spawn the function travels by value with cloudpickle, which is what lets a
  function defined in a notebook cell run in a fresh interpreter.
- Failure: the parent waits on every rank's result pipe and process sentinel at once. The
  first rank that raises (or dies) stops the world: the caller gets that rank's traceback,
  every other rank is terminated. A world that outlives `timeout_s` is stopped with an error
  naming the ranks still running. No child outlives the call, Ctrl-C included.
- Stderr: each rank's file descriptor 2 is a pipe to the parent, which copies everything to
  its own file descriptor 2 (where the ranks' output would have gone anyway) and keeps the
  last lines of each rank. A rank killed by a signal or an `abort()` leaves no traceback,
  only what native code (gloo, NCCL) wrote to stderr just before; those lines go into the
  error.

The native equivalent is `torch.multiprocessing.spawn` / `torchrun`; minidist adds result
collection, by-value shipping of notebook functions and the fast-fail guarantees.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import wait
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist

__all__ = ["launch", "RankFailedError", "WorldTimeoutError", "under_torchrun", "default_backend"]

_GRACE_S = 1.0
_COLLECTIVE_TIMEOUT_MARGIN_S = 10.0
_STDERR_TAIL_BYTES = 4000  # kept per rank
_STDERR_TAIL_LINES = 20  # of those, put into the error of a rank that died
_BACKENDS = ("gloo", "nccl")


class RankFailedError(RuntimeError):
    """A rank raised or died; carries the rank number and that rank's traceback."""

    def __init__(self, rank: int, message: str):
        super().__init__(f"rank {rank} failed:\n{message}")
        self.rank = rank


class WorldTimeoutError(TimeoutError):
    """The world ran past its timeout; names the ranks that had not finished."""

    def __init__(self, ranks: list[int], timeout_s: float):
        super().__init__(
            f"ranks {ranks} still running after timeout_s={timeout_s:g}s; they were stopped. "
            "A rank usually hangs in a collective that the other ranks never join "
            "(different op order or tensor sizes on different ranks)."
        )
        self.ranks = ranks


def under_torchrun() -> bool:
    """True when this process was started by torchrun (or any launcher setting its env)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


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


def _pick_start_method(start_method: str | None, backend: str, threads: int | None) -> str:
    """Fork where it is safe: Linux, gloo, no CUDA in the parent, one intra-op thread.

    A forked child must not start a thread team of its own: torch's CPU build parallelises
    with GNU OpenMP, which hangs in a forked child of a parent that already ran a parallel
    region (any torch op on a tensor big enough). So forked ranks use one intra-op thread,
    and asking for more means spawn.
    """
    if start_method is not None:
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


def _rank_main(payload: Any, rank: int, world_size: int, cfg: dict, conn, err_conn) -> None:
    """Body of one rank: join the world, run the function, send back (status, value, time)."""
    # Everything written to file descriptor 2 from here on, by Python or by native code,
    # goes to the parent, which forwards it and keeps the tail for the error if we die.
    os.dup2(err_conn.fileno(), 2)
    err_conn.close()
    joined = False
    try:
        fn, args, kwargs = cloudpickle.loads(payload) if isinstance(payload, bytes) else payload
        torch.set_num_threads(cfg["threads"])
        # Collectives time out a little after the parent stops the world, so that a hang is
        # reported by the parent, naming every rank still running, not by one rank's
        # collective timeout.
        timeout = timedelta(seconds=cfg["timeout_s"] + _COLLECTIVE_TIMEOUT_MARGIN_S)
        if cfg["backend"] == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            cfg["backend"],
            store=dist.FileStore(cfg["store_path"], world_size),
            rank=rank,
            world_size=world_size,
            timeout=timeout,
        )
        if cfg["backend"] == "gloo":
            # A gloo rank is through init_process_group before its peers may be: one that
            # then runs a short fn and exits makes a peer still connecting fail
            # ("connectFullMesh failed ... Connection closed by peer").
            dist.barrier()
        joined = True
        message = ("ok", fn(*args, **kwargs), time.time())
    except BaseException:
        # Stamped before this rank leaves the group: the others fail only after that.
        message = ("error", traceback.format_exc(), time.time())
    try:
        data = cloudpickle.dumps(message)
    except Exception:
        why = "the result could not be pickled:\n" + traceback.format_exc()
        data = cloudpickle.dumps(("error", why, time.time()))
    conn.send_bytes(data)
    conn.close()
    if joined and message[0] == "ok":
        dist.destroy_process_group()


def _join_torchrun_world(fn, world_size, args, kwargs, backend, timeout_s) -> list:
    env_world = int(os.environ["WORLD_SIZE"])
    if world_size is not None and world_size != env_world:
        raise ValueError(
            f"launch: world_size={world_size} but torchrun started WORLD_SIZE={env_world}; "
            "pass world_size=None (or the same number) under torchrun"
        )
    if not dist.is_initialized():
        backend = backend or default_backend(int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    result = fn(*args, **kwargs)
    results = [None] * env_world
    dist.all_gather_object(results, result)
    return results


def launch(
    fn: Callable[..., Any],
    world_size: int | None,
    *args: Any,
    backend: str | None = None,
    timeout_s: float = 120.0,
    start_method: str | None = None,
    threads_per_rank: int | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Run `fn(*args, **kwargs)` on every rank of a new world; return results in rank order.

    Args:
        fn: the function each rank runs; it sees an initialised default process group
            (`dist.get_rank()`, `dist.get_world_size()`).
        world_size: number of processes (ranks) to start.
        backend: "gloo" or "nccl"; default `default_backend(world_size)`: gloo unless the
            environment variable MINIDIST_BACKEND says "nccl".
        timeout_s: the whole world is stopped after this many seconds (under torchrun, where
            nothing can be stopped, it is the timeout of every collective).
        start_method: "fork" or "spawn"; default fork where it is safe, spawn otherwise.
        threads_per_rank: torch intra-op threads per rank (default: 1 under fork, else
            cores / world_size); more than 1 selects spawn (see `_pick_start_method`).
    """
    if under_torchrun():
        return _join_torchrun_world(fn, world_size, args, kwargs, backend, timeout_s)
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"launch: world_size must be a positive int, got {world_size!r}")
    if timeout_s <= 0:
        raise ValueError(f"launch: timeout_s must be > 0, got {timeout_s!r}")
    backend = backend or default_backend(world_size)
    _check_backend(backend, world_size, "launch: backend")
    method = _pick_start_method(start_method, backend, threads_per_rank)
    if method == "fork":
        # Importing it is what makes a process's first torch optimizer slow (~1 s, and N
        # times that when N forked ranks each do it at once on a small machine): once here.
        importlib.import_module("torch._dynamo")
    payload = _ship(fn, args, kwargs) if method != "fork" else (fn, args, kwargs)
    cfg = {
        "store_path": os.path.join(tempfile.mkdtemp(prefix="minidist-"), "store"),
        "backend": backend,
        "timeout_s": timeout_s,
        "threads": threads_per_rank
        or (1 if method == "fork" else max(1, (os.cpu_count() or 1) // world_size)),
    }
    ctx = mp.get_context(method)
    procs, conns, errs = [], [], []
    try:
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
        return _collect(procs, conns, errs, timeout_s)
    finally:
        _reap(procs)
        for e in errs:
            e.drain()  # what the ranks wrote last still reaches our stderr
            e.close()
        for c in conns:
            c.close()
        shutil.rmtree(os.path.dirname(cfg["store_path"]), ignore_errors=True)


class _StderrTail:
    """The parent's end of one rank's stderr pipe.

    Every chunk read is written to this process's file descriptor 2 (not `sys.stderr`: in
    Jupyter that would put rank noise into cell outputs) and the last few KB are kept for
    the error message should the rank die. Reads never block: under fork a pipe's write end
    may be held by more than the rank, so EOF is no sign that the rank is gone.
    """

    def __init__(self, conn):
        self.conn = conn
        os.set_blocking(conn.fileno(), False)
        self.tail = bytearray()
        self.trimmed = False
        self.eof = False

    def read(self) -> bool:
        """Read and forward what the pipe holds now (one chunk); False if nothing or EOF."""
        if self.eof:
            return False
        try:
            data = os.read(self.conn.fileno(), 65536)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self.eof = True
            return False
        _write_fd2(data)
        self.tail += data
        if len(self.tail) > _STDERR_TAIL_BYTES:
            del self.tail[:-_STDERR_TAIL_BYTES]
            self.trimmed = True
        return True

    def drain(self, max_chunks: int = 64) -> None:
        """Read until the pipe is empty (bounded, should something keep writing)."""
        for _ in range(max_chunks):
            if not self.read():
                return

    def last_lines(self, n: int = _STDERR_TAIL_LINES) -> str:
        text = self.tail.decode(errors="replace")
        if self.trimmed and "\n" in text:
            text = text.split("\n", 1)[1]  # the first line was cut
        return "\n".join(text.rstrip().splitlines()[-n:])

    def close(self) -> None:
        self.eof = True
        self.conn.close()


def _write_fd2(data: bytes) -> None:
    try:
        while data:
            data = data[os.write(2, data) :]
    except OSError:
        pass  # our stderr is closed or full and non-blocking: the tail is still kept


def _collect(procs, conns, errs, timeout_s) -> list:
    """Wait for every rank; on the first failure, stop the world and report its root cause."""
    results: dict[int, Any] = {}
    failures: dict[int, tuple[float, str]] = {}  # rank -> (time it failed, traceback)
    deadline = time.monotonic() + timeout_s
    by_conn = {c: r for r, c in enumerate(conns)}
    by_sentinel = {p.sentinel: r for r, p in enumerate(procs)}
    by_err = {e.conn: e for e in errs}
    while len(results) + len(failures) < len(procs):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if failures:
                break
            raise WorldTimeoutError(sorted(set(range(len(procs))) - set(results)), timeout_s)
        waiting = [c for c, r in by_conn.items() if r not in results and r not in failures]
        waiting += [s for s, r in by_sentinel.items() if r not in results and r not in failures]
        # Stderr is read for as long as it is open, so that no rank blocks on a full pipe.
        waiting += [c for c, e in by_err.items() if not e.eof]
        for ready in wait(waiting, timeout=remaining):
            if ready in by_err:
                by_err[ready].drain(max_chunks=16)
                continue
            rank = by_conn.get(ready, by_sentinel.get(ready))
            if rank in results or rank in failures:
                continue
            if ready in by_conn:
                try:
                    status, value, stamp = cloudpickle.loads(ready.recv_bytes())
                except EOFError:
                    failures[rank] = (time.time(), _exit_message(procs[rank], errs[rank]))
                    continue
                if status == "ok":
                    results[rank] = value
                else:
                    failures[rank] = (stamp, value)
            elif not conns[rank].poll():
                failures[rank] = (time.time(), _exit_message(procs[rank], errs[rank]))
        if failures:
            # The others usually fail a moment later in a collective with the failed rank;
            # wait briefly so the root cause (the earliest failure) is the one reported.
            deadline = min(deadline, time.monotonic() + _GRACE_S)
    if failures:
        rank = min(failures, key=lambda r: failures[r][0])
        others = sorted(set(failures) - {rank})
        also = f"\n(ranks {others} failed after it)" if others else ""
        raise RankFailedError(rank, failures[rank][1] + also)
    return [results[r] for r in range(len(procs))]


def _exit_message(proc, err: _StderrTail) -> str:
    """Why a rank died without a result: its exit code (or signal) and its last stderr lines."""
    proc.join(1.0)
    code = proc.exitcode
    if code is None:
        how = "the process closed its result pipe without a result (still running)"
    else:
        how = f"the process exited with code {code}"
        if code < 0:
            with contextlib.suppress(ValueError):
                how += f" ({signal.Signals(-code).name})"
        how += " before returning a result"
    err.drain()
    lines = err.last_lines()
    if not lines:
        return how
    return f"{how}; the last lines it wrote to stderr:\n{lines}"


def _reap(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 3.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
