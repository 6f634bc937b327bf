"""The parent waiting for a world's results, and the errors it raises when a world fails.

The parent waits on every rank's result pipe, process sentinel and stderr pipe at once.
The first rank that raises (or dies) stops the world: the caller gets that rank's traceback
(`RankFailedError`), and a rank that died without one is described by its exit code (its
signal) and its last stderr lines. When one rank dies, its peers fail a moment later in a
collective with it ("Connection closed by peer"), sometimes before the parent has seen the
death: so the root cause is the earliest failure that is *not* such a lost connection, and
the others are reported as having lost their peer. A world that outlives `timeout_s` is
stopped with an error naming the ranks still running and, from the call board
(`board.py`), which of them were inside a collective and which call
(`WorldTimeoutError`).
"""

from __future__ import annotations

import contextlib
import re
import signal
import time
from multiprocessing.connection import wait
from typing import Any

import cloudpickle

from .board import read_board
from .stderr import _StderrTail

_GRACE_S = 1.0
# What a rank reports when a peer it talks to has gone (gloo, NCCL, the store).
_LOST_PEER = re.compile(
    r"Connection (closed|reset) by peer|Broken pipe|connectFullMesh|ECONNRESET|EPIPE|"
    r"NCCL communicator was aborted|Socket Timeout|recvBytes|sendBytes|"
    r"Timed out waiting .* for client"
)


class RankFailedError(RuntimeError):
    """A rank raised or died; carries the rank number and that rank's traceback."""

    def __init__(self, rank: int, message: str):
        super().__init__(f"rank {rank} failed:\n{message}")
        self.rank = rank


class WorldTimeoutError(TimeoutError):
    """The world ran past its timeout; names the ranks that had not finished and, for each,
    the collective it was inside (`where`: rank -> text, from the call board)."""

    def __init__(self, ranks: list[int], timeout_s: float, where: dict[int, str] | None = None):
        where = where or {}
        lines = "".join(f"\n  rank {r}: {where[r]}" for r in ranks if r in where)
        super().__init__(
            f"ranks {ranks} still running after timeout_s={timeout_s:g}s; they were stopped. "
            "A rank usually hangs in a collective that the other ranks never join "
            "(different op order or tensor sizes on different ranks)." + lines
        )
        self.ranks, self.where = ranks, where


def _collect(
    procs, conns, errs, timeout_s, board_path: str | None = None, peaks: list | None = None
) -> list:
    """Wait for every rank; on the first failure, stop the world and report its root cause.
    `peaks`, if given, gets each rank's peak CUDA bytes (None where not measured)."""
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
            running = sorted(set(range(len(procs))) - set(results))
            where = read_board(board_path, running) if board_path else {}
            raise WorldTimeoutError(running, timeout_s, where)
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
                    status, value, stamp, peak = cloudpickle.loads(ready.recv_bytes())
                except EOFError:
                    failures[rank] = (time.time(), _exit_message(procs[rank], errs[rank]))
                    continue
                if status == "ok":
                    results[rank] = value
                    if peaks is not None:
                        peaks[rank] = peak
                else:
                    failures[rank] = (stamp, value)
            elif not conns[rank].poll():
                failures[rank] = (time.time(), _exit_message(procs[rank], errs[rank]))
        if failures:
            # The others usually fail a moment later in a collective with the failed rank;
            # wait briefly so the root cause (the earliest failure) is the one reported.
            deadline = min(deadline, time.monotonic() + _GRACE_S)
    if failures:
        raise _root_cause(failures)
    return [results[r] for r in range(len(procs))]


def _root_cause(failures: dict[int, tuple[float, str]]) -> RankFailedError:
    """The earliest failure that is not a lost connection (else the earliest); the others
    named as having lost their peer or failed after it."""
    lost = {r for r, (_, text) in failures.items() if _LOST_PEER.search(text)}
    causes = [r for r in failures if r not in lost] or list(failures)
    rank = min(causes, key=lambda r: failures[r][0])
    peers = sorted(lost - {rank})
    others = sorted(set(failures) - lost - {rank})
    also = f"\n(ranks {others} failed after it)" if others else ""
    if peers:
        also += f"\n(ranks {peers} lost their peer: their connection to rank {rank} closed)"
    return RankFailedError(rank, failures[rank][1] + also)


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
