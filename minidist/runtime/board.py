"""Where each rank is: the collective it is inside, on a board the parent can read.

When a world hangs, the parent stops it at `timeout_s`; to say *where* it hung it needs to
know which ranks were inside a collective, and which call. Every minidist collective goes
through `minidist.comm`, which writes the call it enters (op, tag, group size and the line
of minidist or user code that made it) into this rank's slot of a small memory-mapped file
in the world's rendezvous folder, and clears it when the call returns (an asynchronous
call's work may still be pending then: a rank waiting on it is not inside `comm`); the parent reads
every slot when it stops the world (`WorldTimeoutError`). Writing a slot is a memory copy,
no system call. Collectives that bypass `comm` (DCP's, torch's own) are not seen.
"""

from __future__ import annotations

import functools
import mmap
import os
import sys

# bytes per rank: [0] 1 while inside a call, 2 after an asynchronous one (its work may be
# pending), 0 after a blocking one; then the call's description
SLOT = 512
# The library's own folder, by where this file is: never by a folder's name (a checkout is
# itself often called `minidist`, and so may be any folder above a learner's file).
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_COMM_FILE = os.path.join(_PACKAGE, "comm.py")


class CallBoard:
    """This rank's slot of the board (`comm` calls `enter` / `leave`)."""

    def __init__(self, path: str, rank: int):
        self._file = open(path, "r+b")  # noqa: SIM115 (open for the rank's lifetime)
        self._map = mmap.mmap(self._file.fileno(), 0)
        self._at = rank * SLOT

    def enter(self, op: str, tag: str, group_size: int) -> None:
        frame = sys._getframe(2)
        while frame is not None and _short(frame.f_code.co_filename) is None:  # inside comm
            frame = frame.f_back
        where = ""
        if frame is not None:
            code = frame.f_code
            where = f" in {code.co_name} at {_short(code.co_filename)}:{frame.f_lineno}"
        what = f"{op}{f' (tag {tag!r})' if tag else ''} over {group_size} ranks{where}"
        data = b"\x01" + what.encode()[: SLOT - 2] + b"\x00"
        self._map[self._at : self._at + len(data)] = data

    def leave(self, async_op: bool = False) -> None:
        self._map[self._at] = 2 if async_op else 0  # the description stays: the last call


@functools.cache  # a collective's every call asks, for the few files that make them
def _short(filename: str) -> str | None:
    """minidist/... for the library's files, the file's name for others (a notebook cell's
    file is named after its code, so the name stays when the notebook runs again); None for
    `comm` itself."""
    path = os.path.abspath(filename)
    if path == _COMM_FILE:
        return None
    if path.startswith(_PACKAGE + os.sep):
        return os.path.join("minidist", os.path.relpath(path, _PACKAGE))
    return os.path.basename(filename)


def create_board(path: str, world_size: int) -> None:
    with open(path, "wb") as f:
        f.write(b"\x00" * SLOT * world_size)


def read_board(path: str, ranks: list[int]) -> dict[int, str]:
    """rank -> "inside <call>", or where its last call left it."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return {}
    out = {}
    for r in ranks:
        slot = data[r * SLOT : (r + 1) * SLOT]
        if len(slot) < SLOT:
            continue
        text = slot[1:].split(b"\x00", 1)[0].decode(errors="replace")
        if slot[0] == 1:
            out[r] = f"inside {text}"
        elif slot[0] == 2:
            out[r] = (
                f"not inside a blocking call; its last call, asynchronous, may be pending: {text}"
            )
        else:
            out[r] = "not inside a collective" + (f" (its last call: {text})" if text else "")
    return out
