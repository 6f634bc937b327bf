"""The grader's side of the kernel (`grade_run` drives it): how a check cell is run and its
verdict brought back on a channel of the grader's own, how a kernel is started (optionally
under `grade_sandbox`'s bubblewrap); `grade_reap` ends every process it started.

The verdict. The grader opens a pipe for each notebook and the kernel inherits only its
write end (`VERDICT_FD`). A check cell is run as `check_cell_runner` builds it: the modules
the cell imports its `check_*` from (`minidist.zero.check`), and the course's checker
machinery, are dropped from `sys.modules` and imported afresh from disk (a learner's cell
that reassigned `check_x`, or patched the module, is undone; the machinery is imported when
a checker imports it, so that a notebook without minidist does not import torch for every
check cell); each checker the cell calls is
wrapped to count its calls and its returns; the checkers' world and in-process time limits
are stretched by `slack` (room for a loaded machine); the cell runs. The verdict is computed
from the checkers' returns and the exception the cell raised, not from anything displayed
or printed: a pass is a cell that raised nothing and whose every checker call returned. It
is written as one line, tagged with a token made for this cell, on the pipe, which the
grader reads after the cell: lines with another token are ignored, a second line with this
one fails the exercise (forged). Display hooks, `showtraceback`, `sys.stdout`, `print` and
printed verdict lines never reach the pipe. While a check cell runs, the import system is
the one the kernel started with (`IMPORTS`, recorded before the first cell: a learner's
finder on `sys.meta_path`, folder on `sys.path` or `__import__` is set aside, then put
back). A released check cell's checker modules must not come from the submission's folder
nor have changed since grading began (their ctime, which no `os.utime` resets: a
`labcheck.py` or `minidist/` beside the notebook would shadow the course's, a fake one
planted with an old date would fool the notebooks graded after).

This is not a security boundary: code in the same process as the checker, written against
the grader, can still patch what the runner and the checker call (`os.write`, `json`,
torch, builtins). `--sandbox` bounds what it can reach.
"""

from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from pathlib import Path

from .grade_match import CHECK_CALL

VERDICT_FD = "MINIDIST_GRADE_VERDICT_FD"  # the kernel's end of the verdict pipe (not secret)
PING_TIMEOUT_S = 10
FORGED = "two verdicts came back for this check cell: one was forged (not graded as passed)"

RUNNER = r"""
def _minidist_check(source, slack, fresh, machinery, checks, fd, token, folder, since, course):
    import builtins, sys

    # The import system as the kernel started, before any learner's cell (IMPORTS): a
    # finder the learner put on sys.meta_path, a folder put on sys.path, a patched
    # __import__ would hand the check cell a checker of their own.
    ns = __import__("IPython").get_ipython().user_ns
    record = sys.modules.get("_minidist_grade_imports")
    theirs = (sys.meta_path[:], sys.path_hooks[:], sys.path[:], builtins.__import__)
    their_builtins = ns.get("__builtins__", builtins)
    if record is not None:
        sys.meta_path[:], sys.path_hooks[:] = record.meta_path, record.path_hooks
        sys.path[:], builtins.__import__ = record.path, record.import_
    else:  # removed by the learner's code: no check can be trusted
        source = "raise RuntimeError(\"the grader's record of the import system is gone\")"
    sys.path_importer_cache.clear()
    ns["__builtins__"] = builtins

    def run():
        import functools, importlib, json, os, sys
        from IPython import get_ipython

        ns = get_ipython().user_ns
        for name in list(sys.modules):
            if any(name == f or name.startswith(f + ".") for f in (*fresh, *machinery)):
                del sys.modules[name]
        mine = any(f.startswith("minidist.") and f not in machinery for f in fresh)
        if slack != 1 and (mine or "minidist" in sys.modules):
            import minidist.course.catalogue as catalogue
            import minidist.course.failures as failures

            launch, time_limit = catalogue.launch, failures.time_limit

            def stretched_launch(*args, **kwargs):
                for limit in ("timeout_s", "cpu_s"):  # idle_s is no CPU at all, on any machine
                    if kwargs.get(limit) is not None:
                        kwargs[limit] = kwargs[limit] * slack
                return launch(*args, **kwargs)

            catalogue.launch = stretched_launch
            failures.time_limit = lambda seconds: time_limit(seconds * slack)
        modules = []
        for name in fresh:
            try:
                modules.append(importlib.import_module(name))
            except Exception:  # the cell's own import raises it again, in its row
                pass
        # the machinery the checkers imported, which must come from the course's files too
        modules += [sys.modules[n] for n in machinery if n in sys.modules and n not in fresh]
        calls = {"made": 0, "returned": 0, "depth": 0}

        def counted(check):
            @functools.wraps(check)
            def call(*args, **kwargs):
                outer = calls["depth"] == 0  # a checker calling another counts once
                calls["made"] += outer
                calls["depth"] += 1
                try:
                    result = check(*args, **kwargs)
                finally:
                    calls["depth"] -= 1
                calls["returned"] += outer
                return result

            return call

        tracked = False
        for name in checks:
            owner = next((m for m in modules if callable(getattr(m, name, None))), None)
            if owner is not None:
                setattr(owner, name, counted(getattr(owner, name)))
            elif callable(ns.get(name)):
                ns[name] = counted(ns[name])
            else:
                continue
            tracked = True
        verdict = {"token": token, "passed": False, "error": None}
        try:
            for module in modules:  # a file beside the notebook, or written by it, shadows it
                path = os.path.realpath(getattr(module, "__file__", None) or "")
                if folder and os.path.isfile(path):
                    beside = path.startswith(folder + os.sep) and not path.startswith(course)
                    if beside or os.stat(path).st_ctime >= since:  # ctime: no utime resets it
                        raise ImportError(
                            f"the checker module {module.__name__} was loaded from {path}, "
                            "a file the submission brought or wrote, not the course's"
                        )
            exec(compile(source, "<check cell>", "exec"), ns)
            if tracked and calls["made"] == 0:
                verdict["error"] = "the check cell called no checker"
            elif calls["returned"] < calls["made"]:
                verdict["error"] = "a checker did not return"
            else:
                verdict["passed"] = True
        except BaseException as exc:
            # short: the line stays below PIPE_BUF, written at once, never interleaved
            verdict["error"] = f"{type(exc).__name__}: {exc}"[:400]
            raise
        finally:
            try:
                os.write(fd, (json.dumps(verdict) + "\n").encode())
            except OSError:  # the channel was closed: no verdict, which fails
                pass

    try:
        return run()
    finally:
        sys.meta_path[:], sys.path_hooks[:], sys.path[:], builtins.__import__ = theirs
        sys.path_importer_cache.clear()
        ns["__builtins__"] = their_builtins
"""
# Run once, hidden, before the notebook's first cell: the import system as the kernel
# started, restored by RUNNER while a check cell runs.
IMPORTS = """
def _minidist_imports():
    import builtins, sys, types

    record = types.ModuleType("_minidist_grade_imports")
    record.meta_path, record.path_hooks = list(sys.meta_path), list(sys.path_hooks)
    record.path, record.import_ = list(sys.path), builtins.__import__
    sys.modules[record.__name__] = record


try:
    _minidist_imports()
finally:
    del _minidist_imports
"""
CALL = """
try:
    _minidist_check({args})
finally:
    del _minidist_check
"""

MACHINERY = ("minidist.course.check", "minidist.course.failures", "minidist.course.catalogue")
CHECK_IMPORT = re.compile(r"^\s*from\s+([\w.]+)\s+import\b[^\n]*\bcheck_", re.M)


def check_cell_runner(
    source: str, token: str, slack: float, fd: int, guard: tuple[str, float] | None = None
) -> str:
    """The code the kernel runs in place of a check cell (see the module's docstring): the
    modules the check cell imports its checkers from, and the checkers' machinery, are
    imported afresh; the verdict goes to `fd` tagged with `token`. `guard`: (the
    submission's folder, when its run started) for a released check cell, whose checker
    modules must come from neither."""
    fresh = sorted(set(CHECK_IMPORT.findall(source)))
    checks = sorted(set(CHECK_CALL.findall(source)))
    folder, since = guard or (None, 0.0)
    course = str(Path(__file__).resolve().parents[1]) + os.sep  # minidist's own files
    values = (source, slack, fresh, MACHINERY, checks, fd, token, folder, since, course)
    args = ", ".join(map(repr, values))
    return RUNNER + CALL.format(args=args)


def read_verdict(written: bytes, token: str) -> tuple[bool | None, str | None]:
    """(passed, or None when no verdict came; what the checker raised, or `FORGED`) from
    what the pipe received since the previous check cell. Lines without this cell's token
    are ignored (nobody else knows it); two lines with it mean one was forged."""
    mine = []
    for line in written.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("token") == token:
            mine.append(record)
    if len(mine) > 1:
        return False, FORGED
    if not mine:
        return None, None
    error = mine[0].get("error")
    return mine[0].get("passed") is True, error if isinstance(error, str) else None


def drain(fd: int) -> bytes:
    """Everything waiting on the (non-blocking) read end `fd`."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


class VerdictPipe:
    """The channel check cells' verdicts come back on (`grade_kernel`): the grader keeps the
    read end, the kernel inherits the write end."""

    LIMIT = 1 << 20  # bytes kept between two checks (a flood is forged anyway)

    def __init__(self):
        self.read_fd, self.write_fd = os.pipe()
        self.kernel_fd = self.write_fd  # its number in the kernel (inherited as it is)
        os.set_blocking(self.read_fd, False)
        self.written = b""

    def close_write(self) -> None:
        if self.write_fd is not None:
            os.close(self.write_fd)
            self.write_fd = None

    def keep(self) -> None:
        """Read what arrived, to be judged at the next check cell."""
        self.written = (self.written + drain(self.read_fd))[: self.LIMIT]

    def take(self) -> bytes:
        """What arrived since the last `take`."""
        self.keep()
        written, self.written = self.written, b""
        return written


@contextmanager
def verdict_pipe():
    pipe = VerdictPipe()
    try:
        yield pipe
    finally:
        pipe.close_write()
        os.close(pipe.read_fd)


MESSAGE_LIMIT = 32 << 20  # bytes: a larger message from the kernel is never received


def kernel_manager_class(prefix: list[str] | None, scratch: Path):
    """jupyter_client's kernel manager talking over ipc sockets in `scratch` (no TCP port:
    a sandbox has no network), its command prefixed by the sandbox's when `prefix` is given;
    its client's sockets refuse any message past MESSAGE_LIMIT (zmq's MAXMSGSIZE: the
    connection drops it and reconnects). ipykernel sends what a cell prints in one message
    per flush: a cell printing in a loop sent messages of hundreds of MB, each held whole in
    the grader's memory (3 GB after 8 s), and the whole class ended with the grader."""
    import traitlets
    import zmq
    import zmq.asyncio
    from jupyter_client.asynchronous import AsyncKernelClient
    from jupyter_client.manager import AsyncKernelManager

    class GraderKernelClient(AsyncKernelClient):
        @traitlets.default("context")
        def _context_default(self):
            self._created_context = True
            context = zmq.asyncio.Context()
            context.setsockopt(zmq.MAXMSGSIZE, MESSAGE_LIMIT)  # every socket it makes
            return context

    class GraderKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs):
            kwargs.update(transport="ipc", ip=str(scratch / "kernel"))
            kwargs["connection_file"] = str(scratch / "kernel.json")
            super().__init__(**kwargs)
            self.client_factory = GraderKernelClient
            if prefix:  # a signal to bwrap's process group would not reach the kernel
                self.kernel_spec.interrupt_mode = "message"

        def format_kernel_cmd(self, extra_arguments=None):
            return (prefix or []) + super().format_kernel_cmd(extra_arguments)

    return GraderKernelManager
