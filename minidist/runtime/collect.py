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
(`WorldTimeoutError`). With `CpuLimits` it is stopped sooner, and whatever the machine's
load, by what its ranks do with the CPU: all of them idle (a hang: a rank waiting in a
collective uses none) or one of them computing past a budget (a loop that never ends).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import time
from dataclasses import dataclass, field
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
    """The world ran past a limit; names the ranks that had not finished and, for each,
    the collective it was inside (`where`: rank -> text, from the call board). `why` says
    which limit: "timeout" (`timeout_s`, wall clock), "idle" (no running rank used the CPU
    for `idle_s`) or "cpu" (rank `ranks[0]` used `cpu_s` of CPU time)."""

    def __init__(
        self,
        ranks: list[int],
        timeout_s: float,
        where: dict[int, str] | None = None,
        why: str = "timeout",
        spinning: int | None = None,
    ):
        where = where or {}
        lines = "".join(f"\n  rank {r}: {where[r]}" for r in ranks if r in where)
        if why == "idle":
            head = f"ranks {ranks} all sat idle (no CPU used) for idle_s={timeout_s:g}s"
        elif why == "cpu":
            head = f"rank {spinning} used cpu_s={timeout_s:g}s of CPU time, ranks {ranks} running"
        else:
            head = f"ranks {ranks} still running after timeout_s={timeout_s:g}s"
        super().__init__(
            f"{head}; they were stopped. "
            "A rank usually hangs in a collective that the other ranks never join "
            "(different op order or tensor sizes on different ranks)." + lines
        )
        self.ranks, self.where, self.why, self.spinning = ranks, where, why, spinning
        self.limit_s = timeout_s


def _stopped(running, limit_s, board_path, why="timeout", spinning=None) -> WorldTimeoutError:
    """The error for a world stopped at a limit, with where each running rank was."""
    where = read_board(board_path, running) if board_path else {}
    return WorldTimeoutError(running, limit_s, where, why, spinning)


_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
_POLL_S = 0.2
# A rank that used, or waited in the run queue for, less than this share of a core over
# `idle_s` is idle. Measured on 2 cores: a rank waiting in a gloo collective uses 0-0.3% (some
# thread of it wakes now and then); a runnable rank still gets ~5% at load 40, ~10% at load
# 20, and a starved one (load 50, a 3-rank all-gather whose messages had arrived) waits in
# the run queue for most of the window: CPU time alone took it for a hang.
_IDLE_SHARE = 0.02


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process and its threads, or None where unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * _TICK_S
    except (OSError, IndexError, ValueError):
        pass
    try:
        import psutil  # macOS: ipykernel's dependency

        times = psutil.Process(pid).cpu_times()
        return times.user + times.system
    except Exception:
        return None


# Threads that wake on a timer in a rank blocked for good: gloo's transport thread returns
# from epoll about 85 times a second, and at load 10 each wake-up waits ~1.5 ms for a CPU,
# 13% of a window: counted, a hung world under load looked starved and ran to its timeout.
POLLING_THREADS = (b"gloo_tcp_loop",)


def _waited_s(pid: int) -> float:
    """Seconds the threads of a process spent runnable but waiting for a CPU (the run
    queue, /proc/PID/task/*/schedstat's second field), `POLLING_THREADS` left out; 0 where
    unreadable. A thread that ends takes its share with it, which only makes a rank look
    idler, never busier."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/comm", "rb") as f:
                if f.read().strip() in POLLING_THREADS:
                    continue
            with open(f"/proc/{pid}/task/{task}/schedstat", "rb") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


@dataclass
class CpuLimits:
    """Limits on a world by CPU time, which a loaded machine does not stretch: `idle_s`
    seconds in which none of its running ranks uses the CPU or waits for one, `cpu_s`
    seconds of one rank's CPU time. Where a rank's CPU time cannot be read, `cpu_s` is a
    wall limit."""

    idle_s: float | None = None
    cpu_s: float | None = None
    # (time, {running rank: CPU seconds it used or waited for}): its demand for the CPU
    _samples: list = field(default_factory=list)
    _start: float = field(default_factory=time.monotonic)
    _read: float = -math.inf  # when /proc was last read

    @property
    def poll_s(self) -> float:
        """How often the ranks' /proc is read: a twentieth of the shorter limit, at least
        `_POLL_S`. A 16-rank world has ~20 threads a rank to read, and a 60 s limit needs no
        reading 5 times a second."""
        limit = min((x for x in (self.idle_s, self.cpu_s) if x is not None), default=0.0)
        return max(_POLL_S, limit / 20)

    def check(self, procs, running: list[int], board_path: str | None) -> None:
        """Raise `WorldTimeoutError` if the running ranks broke a limit."""
        now = time.monotonic()
        if now - self._read < self.poll_s / 2:  # woken early (a rank's stderr, a result)
            return
        self._read = now
        cpu = {r: _cpu_s(procs[r].pid) for r in running}
        if any(c is None for c in cpu.values()):
            if self.cpu_s is not None and now - self._start >= self.cpu_s:
                raise _stopped(running, self.cpu_s, board_path)
            return
        if self.cpu_s is not None:
            spinning = [r for r in running if cpu[r] >= self.cpu_s]
            if spinning:
                raise _stopped(running, self.cpu_s, board_path, "cpu", spinning[0])
        if self.idle_s is None:
            return
        if self._samples and set(self._samples[-1][1]) != set(running):
            # a rank finished: progress, and the ranks left may have waited for it all along
            # (they still need a moment of CPU to see its last message): a fresh window
            self._samples.clear()
        demand = {r: cpu[r] + _waited_s(procs[r].pid) for r in running}
        self._samples.append((now, demand))
        while len(self._samples) > 1 and self._samples[1][0] <= now - self.idle_s:
            self._samples.pop(0)
        first_t, first = self._samples[0]
        span = now - first_t
        if span >= self.idle_s and all(
            demand[r] - first.get(r, 0.0) < _IDLE_SHARE * span for r in running
        ):
            raise _stopped(running, self.idle_s, board_path, "idle")


def _collect(
    procs,
    conns,
    errs,
    timeout_s,
    board_path: str | None = None,
    peaks: list | None = None,
    limits: CpuLimits | None = None,
) -> list:
    """Wait for every rank; on the first failure, stop the world and report its root cause.
    `peaks`, if given, gets each rank's peak CUDA bytes (None where not measured); `limits`
    stops the world on its CPU limits too."""
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
            raise _stopped(running, timeout_s, board_path)
        waiting = [c for c, r in by_conn.items() if r not in results and r not in failures]
        waiting += [s for s, r in by_sentinel.items() if r not in results and r not in failures]
        # Stderr is read for as long as it is open, so that no rank blocks on a full pipe.
        waiting += [c for c, e in by_err.items() if not e.eof]
        if limits is not None and not failures:
            running = [r for r in range(len(procs)) if r not in results]
            limits.check(procs, running, board_path)
            remaining = min(remaining, limits.poll_s)
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
