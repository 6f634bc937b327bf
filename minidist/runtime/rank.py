"""The rank side of a world: the body each started process runs.

- Rendezvous: each world meets in a `FileStore` in a fresh temporary folder, so worlds never
  race for a port. (A `TCPStore` served from a thread of the parent is not safe here: a
  rank forked while that thread holds a lock can deadlock in rendezvous.) Gloo ranks then
  pass a barrier, so that none runs `fn` and exits while a peer is still connecting to it.
- Stderr: the rank's file descriptor 2 becomes its end of a pipe to the parent (read there
  by `stderr._StderrTail`).
- Result: one message on the result pipe, `(status, value, time, peak)`, where status is "ok"
  or "error" (the value then is the traceback), the time stamps when the rank finished and
  peak is the rank's peak CUDA bytes while `fn` ran when the parent asked for it
  (`cuda_memory.py`), else None. The message is pickled by `host.dumps_on_host`: tensors the
  rank returns on a GPU reach the parent as CPU copies.
- Dying with the parent: on Linux the kernel sends the rank SIGKILL when the parent dies
  (`prctl(PR_SET_PDEATHSIG)`, prctl(2)); elsewhere a watchdog thread polls the parent's pid.
  A parent killed by SIGKILL leaves no rank behind (its folders are swept by the next
  `launch`, `parent._sweep_stale`).
- Its own process group (`os.setpgid`): the processes the rank starts are in it, and the
  parent kills the group when the world ends (`parent._reap`).
- Where it is: `comm` writes the collective this rank is inside to the world's call board
  (`board.py`), which the parent reads when the world hangs.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist

from .. import comm
from ..device_guard import rank_guard
from . import cuda_memory
from .board import CallBoard
from .host import dumps_on_host

_COLLECTIVE_TIMEOUT_MARGIN_S = 10.0
_PR_SET_PDEATHSIG = 1
_WATCHDOG_S = 0.5


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when the parent dies (Linux), else a watchdog thread that exits
    once the parent is gone; either way, exit now if it already is."""
    armed = False
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
    if not armed:

        def watch():
            while os.getppid() == parent_pid:
                time.sleep(_WATCHDOG_S)
            os._exit(1)

        threading.Thread(target=watch, name="minidist-parent-watchdog", daemon=True).start()


def _rank_main(payload: Any, rank: int, world_size: int, cfg: dict, conn, err_conn) -> None:
    """Body of one rank: join the world, run the function, send back (status, value, time,
    peak CUDA bytes or None)."""
    # Everything written to file descriptor 2 from here on, by Python or by native code,
    # goes to the parent, which forwards it and keeps the tail for the error if we die.
    os.dup2(err_conn.fileno(), 2)
    err_conn.close()
    if faulthandler.is_enabled():
        # inherited by fork, still writing to the launching process's file (pytest's copy
        # of the terminal): a fatal error's Python stack (an abort in gloo) goes to the
        # parent with the rest of this rank's stderr
        faulthandler.enable(file=2)
    _die_with_parent(cfg["parent_pid"])
    # A process group of its own, which every process the rank starts joins: `_reap` kills
    # the group when the world ends, so that none outlives the world (`sleep 30` started by
    # a rank lived on after launch returned, and after its caller exited).
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    comm._board = CallBoard(cfg["board_path"], rank)
    joined, peak = False, None
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
        if cfg.get("cuda_peak"):
            cuda_memory.reset_on_rank()
        with rank_guard():  # MINIDIST_DEVICE_GUARD=1: no tensor without a device (tests)
            value = fn(*args, **kwargs)
        if cfg.get("cuda_peak"):
            peak = cuda_memory.read_on_rank()
        message = ("ok", value, time.time(), peak)
    except BaseException:
        # Stamped before this rank leaves the group: the others fail only after that.
        message = ("error", traceback.format_exc(), time.time(), None)
    try:
        data = dumps_on_host(message)
    except Exception:
        why = "the result could not be pickled:\n" + traceback.format_exc()
        data = cloudpickle.dumps(("error", why, time.time(), None))
    conn.send_bytes(data)
    conn.close()
    if joined and message[0] == "ok" and dist.is_initialized():  # fn may have destroyed it
        dist.destroy_process_group()
