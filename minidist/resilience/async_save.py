"""Saving without stopping for long: copy to host memory, then write in the background.

A synchronous save blocks training for the whole write (serialise, write, fsync, checksum,
rename). An asynchronous one blocks only for the copy of this rank's pieces into host
memory (a `clone` on the CPU, a device-to-host copy on a GPU); a thread then writes that
copy with the same atomic protocol as `universal.write` while training goes on: the
optimizer may change the live tensors, the copy keeps the step it was taken at.
torchtitan's `async_mode="async"` does the same with `dcp.async_save` (Wang et al. 2024,
"TorchTitan", section 3.3.3; the Gemini and CheckFreq papers measure how much of a save's
time this hides). Young's interval √(2δM) shrinks with the blocked time δ
(`theory.py`), so a cheaper save can be taken more often for the same loss.

- The background write's collectives (DCP's plan exchange, the barriers, the final
  broadcast) run on a process group of their own, made once per `AsyncSaver` on every rank,
  so they never interleave with the training's collectives on the same group.
- One save in flight at a time: the next `save` (and `wait`) first waits for the previous
  one, and raises its error if it failed; host memory holds at most one copy.
- Killed while a background write runs, the process leaves the previous checkpoint whole:
  the write goes into `.<name>.unfinished` and only its last act renames it into place.

Not here: pinned host buffers reused between saves (a GPU's fastest copy), a write in
another process (`dcp.async_save`'s process executor), saving while a collective of the
checkpoint's own group is still in flight elsewhere.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time

import torch.distributed as dist

from ..pieces import Piece
from .state import TrainingState
from .universal import save_chunks, write


class AsyncSaver:
    """`save(path, pieces, state, layout)` copies and returns; the write runs in a thread.

    Every rank of `group` makes one (it creates the writer's process group) and calls
    `save` and `wait` alike. `blocked_s`: how long the last `save` blocked its caller.
    """

    def __init__(self, group=None):
        ranks = dist.get_process_group_ranks(group) if group is not None else None
        self.group = dist.new_group(ranks, backend="gloo")  # the writer's own collectives
        self.blocked_s = 0.0
        self.write_s = 0.0
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def save(
        self,
        path: str | os.PathLike,
        pieces: list[Piece],
        state: TrainingState | None = None,
        layout: dict | None = None,
    ) -> None:
        self.wait()
        start = time.perf_counter()
        chunks = [
            dataclasses.replace(c, tensor=c.tensor.detach().to("cpu", copy=True))
            for c in save_chunks(pieces, state or TrainingState(), layout, self.group)
        ]
        self.blocked_s = time.perf_counter() - start
        self._thread = threading.Thread(
            target=self._write, args=(path, chunks), name="minidist-async-save", daemon=True
        )
        self._thread.start()

    def _write(self, path, chunks) -> None:
        start = time.perf_counter()
        try:
            write(path, chunks, self.group)
        except BaseException as e:  # handed to the training thread by wait()
            self._error = e
        self.write_s = time.perf_counter() - start

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Wait for the save in flight (if any); raise its error if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"AsyncSaver: the background save failed ({error!r})") from error

    def close(self) -> None:
        self.wait()
        dist.destroy_process_group(self.group)


def copy_nbytes(pieces: list[Piece]) -> int:
    """Host memory one asynchronous save holds: this rank's owned pieces."""
    return sum(p.tensor.numel() * p.tensor.element_size() for p in pieces if p.owner)


__all__ = ["AsyncSaver", "copy_nbytes"]
