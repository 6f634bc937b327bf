"""Grade one notebook (`grade.grade_notebook`): read it, find its exercises, run it in a fresh
kernel and turn each exercise into a row. The exercises are the released exercise notebook's
(`exercises/` or `released=`): the released notebook it shares the most exercises with
(headings, checkers called), so a renamed notebook is still graded by the released check
cells and a deleted check cell is a FAIL; a notebook that shares none with any released
one (and has no namesake) is graded by its own check cells. Check cells run as released
(a modified one restored and flagged) through `grade_kernel`'s runner, whose verdict comes
back on a pipe of the grader's (`grade_kernel.VerdictPipe`), not through what the kernel
displays; every process the run started is ended with it (`grade_reap`). An earlier failing
cell (SyntaxError, ModuleNotFoundError) is named in the row it caused. A file that is not a
notebook is ERROR rows, never a crash.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import grade_kernel, grade_reap
from .grade_kernel import FORGED, check_cell_runner, read_verdict, verdict_pipe
from .grade_match import (
    CHECK_CALL,
    Exercise,
    _match,
    _source,
    find_exercises,
    read_notebook,
    released_twin,
)

NO_VERDICT = "the check cell gave no verdict (the grader's verdict channel was closed?)"
MESSAGE_CHARS = 2000  # a row's message; the whole output stays in the executed notebook


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def cap(message: str, limit: int = MESSAGE_CHARS) -> str:
    """`message`, cut to `limit` characters saying how much was cut (a learner's 50 MB print
    would otherwise become a 50 MB cell of the CSV and of the table)."""
    if len(message) <= limit:
        return message
    more = len(message) - limit
    return f"{message[:limit]} [... {more:,} more characters: see the executed notebook]"


@dataclass
class Result:
    """One exercise of one notebook: PASS, FAIL or ERROR (the notebook could not be graded),
    what the checker said, how long its check cell took."""

    notebook: str
    exercise: str
    status: str
    message: str
    seconds: float
    student: str = ""

    def __post_init__(self):
        self.message = cap(self.message)

    @property
    def passed(self) -> bool:
        return self.status == "PASS"


def _error_text(out) -> str:
    return ANSI.sub("", f"{out['ename']}: {out['evalue']}").strip()


def _stream_tail(outputs) -> str:
    text = "".join(_source({"source": o.get("text", "")}) for o in outputs if "text" in o)
    said = [line for line in text.splitlines() if line.strip()]
    return said[-1] if said else "the check cell ran without an error"


def unreadable(path: Path, exercises: list[Exercise], why: str, student: str) -> list[Result]:
    """ERROR rows for a file that cannot be graded: one per released exercise, else one."""
    message = f"could not grade {path.name}: {why}"
    names = [ex.name for ex in exercises] or ["(the whole notebook)"]
    return [Result(str(path), name, "ERROR", message, 0.0, student) for name in names]


def plan(path: Path, released: Path | None):
    """(the notebook or the reason it is unreadable, [(learner's cell or None, exercise,
    modified)], whether they are a released notebook's exercises) for a notebook to
    grade."""
    import nbformat

    try:
        nb = read_notebook(path)
    except ValueError as exc:
        twin = released_twin(path, released)  # by name only: the file cannot be read
        exercises = [ex for _, ex in find_exercises(nbformat.read(twin, 4))] if twin else []
        return str(exc), [(None, ex, False) for ex in exercises], twin is not None
    twin = released_twin(path, released, nb)
    exercises = [ex for _, ex in find_exercises(nbformat.read(twin, 4))] if twin else []
    if twin is None:
        return nb, [(i, ex, False) for i, ex in find_exercises(nb)], False
    matched = _match(nb, exercises)
    rows = []
    for index, ex in zip(matched, exercises):
        modified = index is not None and nb.cells[index].source.strip() != ex.source.strip()
        rows.append((index, ex, modified))
    return nb, rows, True


class Run:
    """One notebook in one kernel: its cells in order, each error kept for the rows."""

    def __init__(
        self,
        nb,
        path: Path,
        timeout_s: float,
        slack: float,
        sandbox: dict | None,
        released: bool,
        since: float | None = None,
    ):
        self.nb, self.path, self.timeout_s, self.slack = nb, path, timeout_s, slack
        self.sandbox = sandbox
        # a checker module changed since grading began (by this notebook or an earlier one)
        # is the learner's, whatever date it claims
        since = time.time() if since is None else since
        self.guard = (str(path.parent.resolve()), since) if released else None
        self.errors: list[tuple[int, str]] = []  # (cell, "Kind: message") outside checks

    def cells(self, rows) -> list[Result]:
        from .grade_client import client_for, run_cell, run_hidden

        checks = {index: (ex, modified) for index, ex, modified in rows if index is not None}
        marker = uuid.uuid4().hex
        results: dict[int, Result] = {}
        abandoned = None
        with grade_reap.reaping(marker), _scratch() as scratch, verdict_pipe() as pipe:
            client, env = client_for(self.nb, self.path, self.timeout_s, self.sandbox, scratch)
            env[grade_reap.RUN_MARKER] = marker
            env[grade_kernel.VERDICT_FD] = str(pipe.write_fd)
            self.pipe = pipe
            kernel = pgid = None
            try:
                with _started(client, env, pass_fds=(pipe.write_fd,)):
                    pipe.close_write()  # the kernel's now; the pipe never ends while it lives
                    kernel = getattr(client.km.provisioner, "pid", None)
                    pgid = getattr(client.km.provisioner, "pgid", None)
                    grade_reap.started(marker, kernel)
                    run_hidden(client, grade_kernel.IMPORTS)  # before any learner's code
                    for index, cell in enumerate(self.nb.cells[: max(checks, default=-1) + 1]):
                        if cell.cell_type != "code":
                            continue
                        start = time.perf_counter()
                        if index in checks:
                            passed, message = self._check(client, index, *checks[index])
                            status = "PASS" if passed else "FAIL"
                            seconds = time.perf_counter() - start
                            name = checks[index][0].name
                            results[index] = Result(str(self.path), name, status, message, seconds)
                            abandoned = client.abandoned
                        else:
                            abandoned = run_cell(client, cell, index, self.timeout_s)
                            pipe.keep()  # what a learner's cell wrote counts at the next check
                            errors = [o for o in cell.outputs if o.output_type == "error"]
                            self.errors += [(index, _error_text(o)) for o in errors]
                        if abandoned:
                            break
            finally:
                grade_reap.end_run(marker, kernel, pgid)
        out = []
        for index, ex, _ in rows:
            if index is None:
                call = ex.source.strip().splitlines()[-1]
                message = (
                    "the check cell of this exercise is missing from the notebook (deleted?): "
                    f"restore it from the released exercise notebook ({call})"
                )
                out.append(Result(str(self.path), ex.name, "FAIL", message, 0.0))
            elif index in results:
                out.append(results[index])
            else:
                message = f"not run: {abandoned}"
                out.append(Result(str(self.path), ex.name, "FAIL", message, 0.0))
        return out

    def _check(self, client, index: int, ex: Exercise, modified: bool) -> tuple[bool, str]:
        from .grade_client import run_cell

        cell = self.nb.cells[index]
        token = uuid.uuid4().hex
        fd = self.pipe.kernel_fd
        cell.source = check_cell_runner(ex.source, token, self.slack, fd, self.guard)
        client.abandoned = run_cell(client, cell, index, self.timeout_s)
        cell.source = ex.source
        passed, said = read_verdict(self.pipe.take(), token)
        flag = "[check cell modified: graded with the released one] " if modified else ""
        if client.abandoned:
            return False, flag + client.abandoned
        if client.timed_out:
            return False, flag + (
                f"the cell ran past the {self.timeout_s:g} s per-cell timeout and was "
                "interrupted (a loop that never ends, or a rank waiting for a message no rank "
                "sends?)"
            )
        errors = [_error_text(o) for o in cell.outputs if o.get("output_type") == "error"]
        if passed and not errors:
            return True, flag + _stream_tail(cell.outputs)
        if said != FORGED:  # the full text the cell showed, else the runner's short one
            said = (errors or [said or NO_VERDICT])[0]
        earlier = self._earlier(index)
        if earlier:
            said = f"an earlier cell failed first (cell {earlier[0]}: {earlier[1]}); then {said}"
        return False, flag + said

    def _earlier(self, index: int) -> tuple[int, str] | None:
        """The first error since the previous check cell, else before the first one."""
        checks = [i for i, c in enumerate(self.nb.cells) if i < index and _is_check(c)]
        since = checks[-1] if checks else -1
        mine = [e for e in self.errors if since < e[0] < index]
        setup = [e for e in self.errors if e[0] < (min(checks) if checks else index)]
        return (mine or setup or [None])[0]


@contextmanager
def _scratch():
    """The kernel's own folder (its sockets; under `--sandbox` also its HOME and TMPDIR),
    removed afterwards whatever the learner left in it (`remove_tree`)."""
    scratch = tempfile.mkdtemp(prefix="minidist-grade-")
    try:
        yield scratch
    finally:
        remove_tree(Path(scratch))


def remove_tree(top: Path) -> None:
    """Remove `top` and everything in it, at any depth, without recursion and without long
    paths: each folder met is first moved up to lie directly in `top` (a learner's tree
    3,000 folders deep stops `shutil.rmtree` with a RecursionError, and its paths pass
    PATH_MAX); symlinks are removed, never followed; folders made unreadable are opened
    again."""
    pending, moved, tag = [top], 0, uuid.uuid4().hex
    while pending:
        folder = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except PermissionError:
            os.chmod(folder, 0o700)
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                moved += 1
                flat = top / f".minidist-remove-{tag}-{moved}"
                try:
                    os.rename(entry.path, flat)
                except PermissionError:
                    os.chmod(folder, 0o700)
                    os.rename(entry.path, flat)
                pending.append(flat)
            else:
                try:
                    os.unlink(entry.path)
                except PermissionError:
                    os.chmod(folder, 0o700)
                    os.unlink(entry.path)
        if folder != top:
            os.rmdir(folder)
    os.rmdir(top)


class KernelStartError(RuntimeError):
    """The notebook's kernel did not start (its exercises become ERROR rows)."""


@contextmanager
def _started(client, env: dict, pass_fds: tuple[int, ...] = ()):
    """nbclient's kernel, its output kept off the grader's (it would break --json), given
    `pass_fds` (the verdict pipe's write end)."""
    import subprocess

    setup = client.setup_kernel(env=env, stdout=subprocess.DEVNULL, pass_fds=pass_fds)
    try:
        with grade_reap.starting(env[grade_reap.RUN_MARKER]):
            setup.__enter__()
    except Exception as exc:
        _close_sockets(client)
        raise KernelStartError(f"the kernel did not start ({type(exc).__name__}: {exc})") from exc
    try:
        yield
    except BaseException as exc:
        if not setup.__exit__(type(exc), exc, exc.__traceback__):
            raise
    else:
        setup.__exit__(None, None, None)


def _close_sockets(client) -> None:
    """Close what a kernel that failed to start left open: jupyter_client keeps the socket
    whose connect failed (a socket path past the 107 bytes of AF_UNIX, say) in its zmq
    context. Collected later in one garbage cycle with that socket, the context's finalizer
    would wait for it forever (pyzmq's `term`), stopping the grader at a random line."""
    km = getattr(client, "km", None)
    context = getattr(km, "context", None) if km is not None else None
    if context is not None and not context.closed:
        context.destroy(linger=0)


def _is_check(cell) -> bool:
    return cell.cell_type == "code" and bool(CHECK_CALL.search(cell.source))


def grade_one(
    path: Path,
    timeout_s: float,
    released: Path | None,
    slack: float = 3.0,
    sandbox: dict | None = None,
    student: str = "",
    since: float | None = None,
):
    """(rows, the executed notebook or None) for one notebook; never raises for a bad file.
    `since`: when grading began (default: now), after which no checker module may change."""
    nb, rows, twin = plan(path, released)
    if isinstance(nb, str):
        return unreadable(path, [ex for _, ex, _ in rows], nb, student), None
    if not rows:
        return [], None
    run = Run(nb, path, timeout_s, slack, sandbox, twin, since)
    try:
        results = run.cells(rows)
    except KernelStartError as exc:
        return unreadable(path, [ex for _, ex, _ in rows], str(exc), student), None
    for r in results:
        r.student = student
    return results, nb
