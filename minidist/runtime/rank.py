"""The rank side of a world: the body each started process runs.

- Rendezvous: each world meets in a `FileStore` in a fresh temporary folder, so worlds never
  race for a port. (A `TCPStore` served from a thread of the parent is not safe here: a
  rank forked while that thread holds a lock can deadlock in rendezvous.) Gloo ranks then
  pass a barrier, so that none runs `fn` and exits while a peer is still connecting to it.
- Stderr: the rank's file descriptor 2 becomes its end of a pipe to the parent (read there
  by `stderr._StderrTail`).
- Result: one message on the result pipe, `(status, value, time)`, where status is "ok" or
  "error" (the value then is the traceback) and the time stamps when the rank finished.
"""

from __future__ import annotations

import os
import time
import traceback
from datetime import timedelta
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist

from ..device_guard import rank_guard

_COLLECTIVE_TIMEOUT_MARGIN_S = 10.0


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
        with rank_guard():  # MINIDIST_DEVICE_GUARD=1: no tensor without a device (tests)
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
