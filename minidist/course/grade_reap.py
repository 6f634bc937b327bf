"""No process a notebook started outlives its grading (`grade_run` calls `reaping` around a
notebook's run and `end_run` at its end).

While it grades, the grader is a child subreaper (Linux's `prctl(PR_SET_CHILD_SUBREAPER)`):
a learner's process whose parent dies is re-parented to the grader instead of to init, so
it stays in view however often it forks, leaves its session or clears its environment. At
the end of each notebook the grader kills, again and again until none is left (bounded by
`END_WITHIN_S`), every process of the run: the kernel's process group, the kernel and its
descendants, every process carrying the run's marker (`RUN_MARKER`, in the environment the
kernel was started with), and every child of the grader that is no other running notebook's
(with `-j N` a process whose parent died and that cleared its marker cannot be told from
another notebook's: it is ended at the end of the first notebook to finish while no kernel
is starting). Each killed child of the grader is reaped. Elsewhere than on Linux only the
group and the marker remain.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

RUN_MARKER = "MINIDIST_GRADE_RUN"
END_WITHIN_S = 10.0
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>

_lock = threading.Lock()
_kernels: dict[str, int | None] = {}  # run marker -> kernel pid, for every notebook running
# The runs whose kernel is starting. Between its fork and its exec a kernel is an unmarked
# child of the grader (it still has the grader's environment), as an orphan that cleared its
# marker is: another notebook's end, sweeping then, killed it ("Kernel died before replying
# to kernel_info", once in a make test at -j 2 under load 15).
_starting: set[str] = set()
_before: set[int] = set()  # the grader's own children before grading started: never touched


def _subreaper(on: bool) -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)


@contextmanager
def reaping(marker: str):
    """The grader is a subreaper while any notebook runs (`marker`: this run's)."""
    with _lock:
        if not _kernels:
            _before.clear()
            _before.update(pid for pid, proc in _table().items() if proc[0] == os.getpid())
            _subreaper(True)
        _kernels[marker] = None
    try:
        yield
    finally:
        with _lock:
            del _kernels[marker]
            if not _kernels:
                _subreaper(False)


@contextmanager
def starting(marker: str):
    """Around the start of run `marker`'s kernel, until it has replied (so it has exec'd and
    carries the marker): meanwhile no other run's end takes an unmarked child for an orphan."""
    with _lock:
        _starting.add(marker)
    try:
        yield
    finally:
        with _lock:
            _starting.discard(marker)


def started(marker: str, kernel: int | None) -> None:
    """The run's kernel (a child of the grader that another run's sweep must leave alone)."""
    with _lock:
        _kernels[marker] = kernel


def end_run(marker: str, kernel: int | None, pgid: int | None) -> list[int]:
    """Kill every process of the run until none is left (see the module's docstring);
    returns the pids killed."""
    killed: list[int] = []
    deadline = time.monotonic() + END_WITHIN_S
    while True:
        if pgid:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        alive, dead = _members(marker, kernel, pgid)
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in dead:  # a zombie child of the grader: reaped here, or it stays one
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        if not (alive or dead) or time.monotonic() > deadline:
            return killed
        time.sleep(0.005)


def _members(marker: str, kernel: int | None, pgid: int | None) -> tuple[list[int], list[int]]:
    """(the run's live processes, the run's zombies that are the grader's children)."""
    me, table = os.getpid(), _table()
    with _lock:
        others = {m: k for m, k in _kernels.items() if m != marker}
        orphans_known = not (_starting - {marker})  # no unmarked kernel of another run
    roots = set()
    for pid, (ppid, group) in table.items():
        if pid == me:
            continue
        carries = _markers(pid)
        if marker in carries or pid == kernel or (pgid and group == pgid):
            roots.add(pid)
        elif ppid == me and orphans_known and pid not in _before and pid not in others.values():
            if not carries & set(others):  # another notebook's process: its own sweep's
                roots.add(pid)
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    run, pending = set(), list(roots)
    while pending:
        pid = pending.pop()
        if pid not in run and pid != me:
            run.add(pid)
            pending += children.get(pid, [])
    zombies = {pid for pid in run if _state(pid) == "Z"}
    dead = [pid for pid in zombies if table[pid][0] == me]
    return sorted(run - zombies), dead


def _table() -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, process group)} of every process in /proc."""
    out = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields:
                out[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return out


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state, ppid, pgrp, ...)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def _state(pid: int) -> str:
    fields = _stat(pid)
    return fields[0] if fields else "Z"


def _markers(pid: int) -> set[str]:
    """The run markers in the process's environment (as it was started)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return set()
    prefix = f"{RUN_MARKER}=".encode()
    return {v[len(prefix) :].decode() for v in environ.split(b"\0") if v.startswith(prefix)}
