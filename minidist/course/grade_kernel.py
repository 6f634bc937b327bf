"""The grader's side of the kernel (`grade_run` drives it): how a check cell is run and its
verdict brought back on a channel of the grader's own, how a kernel is started (optionally in
a bubblewrap sandbox); `grade_reap` ends every process it started.

The verdict. The grader opens a pipe for each notebook and the kernel inherits only its
write end (`VERDICT_FD`). A check cell is run as `check_cell_runner` builds it: the modules
the cell imports its `check_*` from (`minidist.zero.check`), and the course's checker
machinery, are dropped from `sys.modules` and imported afresh from disk (a learner's cell
that reassigned `check_x`, or patched the module, is undone); each checker the cell calls is
wrapped to count its calls and its returns; the checkers' world and in-process time limits
are stretched by `slack` (room for a loaded machine); the cell runs. The verdict is computed
from the checkers' returns and the exception the cell raised, not from anything displayed
or printed: a pass is a cell that raised nothing and whose every checker call returned. It
is written as one line, tagged with a token made for this cell, on the pipe, which the
grader reads after the cell: lines with another token are ignored, a second line with this
one fails the exercise (forged). Display hooks, `showtraceback`, `sys.stdout`, `print` and
printed verdict lines never reach the pipe. A released check cell's checker modules must
not come from the submission's folder nor have been written while the notebook ran (a
`labcheck.py` or `minidist/` beside the notebook would shadow the course's).

This is not a security boundary: code in the same process as the checker, written against
the grader, can still patch what the runner and the checker call (`os.write`, `json`,
torch, builtins). `--sandbox` bounds what it can reach.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from .grade_match import CHECK_CALL

VERDICT_FD = "MINIDIST_GRADE_VERDICT_FD"  # the kernel's end of the verdict pipe (not secret)
PING_TIMEOUT_S = 10
# Kept in a sandboxed kernel's environment (everything else is dropped).
SOCKET_DIRS = (Path("/run"), Path("/var/run"))  # where a host's services keep their sockets
SANDBOX_ENV = ("PATH", "LANG", "LC_ALL", "PYTHONPATH", "TRITON_INTERPRET", "OMP_NUM_THREADS")
FORGED = "two verdicts came back for this check cell: one was forged (not graded as passed)"

RUNNER = r"""
def _minidist_check(source, slack, fresh, machinery, checks, fd, token, folder, since, course):
    import functools, importlib, json, os, sys
    from IPython import get_ipython

    ns = get_ipython().user_ns
    for name in list(sys.modules):
        if any(name == f or name.startswith(f + ".") for f in fresh):
            del sys.modules[name]
    mine = any(f.startswith("minidist.") and f not in machinery for f in fresh)
    if slack != 1 and (mine or "minidist" in sys.modules):
        import minidist.course.catalogue as catalogue
        import minidist.course.failures as failures

        launch, time_limit = catalogue.launch, failures.time_limit

        def stretched_launch(*args, timeout_s=None, **kwargs):
            scaled = None if timeout_s is None else timeout_s * slack
            return launch(*args, timeout_s=scaled, **kwargs)

        catalogue.launch = stretched_launch
        failures.time_limit = lambda seconds: time_limit(seconds * slack)
    modules = []
    for name in fresh:
        try:
            modules.append(importlib.import_module(name))
        except Exception:  # the cell's own import raises it again, in its row
            pass
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
                if beside or os.stat(path).st_mtime >= since:
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
    fresh = sorted(set(CHECK_IMPORT.findall(source)) | set(MACHINERY))
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


def bwrap_problem() -> str | None:
    """Why `--sandbox` cannot run here (None when it can)."""
    if shutil.which("bwrap") is None:
        return "--sandbox needs bubblewrap (`bwrap`): apt-get install -y bubblewrap"
    probe = subprocess.run(
        ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "true"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        said = (probe.stderr.strip().splitlines() or ["no message"])[-1]
        return f"--sandbox: bubblewrap cannot make a sandbox here ({said})"
    return None


def sandbox_prefix(scratch: Path, notebook_dir: Path, hide: list[Path]) -> list[str]:
    """bwrap's arguments: no network, the file tree read-only except `scratch` and a fresh
    /tmp, `hide` (other learners' folders, the instructor's home) and /run replaced by empty
    folders (Python and minidist shown again when they live there),
    the host's unix sockets left visible covered, a pid namespace of its own (every process
    in it dies with the kernel); the kernel gets `sandbox_env` only."""
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session"]
    args += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    # Hidden whatever lives inside: /tmp, the host's sockets (/run: docker's, D-Bus's; "no
    # network" covers TCP, not a socket file), and `hide` (the home, other learners).
    masked = [Path("/tmp")] + [p for p in SOCKET_DIRS if p.is_dir() and not p.is_symlink()]
    masked += [folder for folder in hide if folder.is_dir()]
    needed = _needed()
    for folder in masked:
        args += ["--tmpfs", str(folder)]
    # Python and minidist may live in a hidden folder (a venv, pyenv or clone under the
    # home or /tmp): shown again, read-only, and only they...
    shown = [p for p in needed if any(_within(p, folder) for folder in masked)]
    for path in shown:
        args += ["--ro-bind", str(path), str(path)]
    for folder in masked:  # ... without what they hold of a hidden folder (a class inside)
        if any(_within(folder, path) and folder != path for path in shown):
            args += ["--tmpfs", str(folder)]
    args += ["--ro-bind", str(notebook_dir), str(notebook_dir)]
    args += ["--bind", str(scratch), str(scratch), "--chdir", str(notebook_dir)]
    # A host service's socket in a folder left visible (beside the notebooks, /var/tmp)
    # would still take the learner's connection: each is covered by /dev/null.
    seen = [notebook_dir, *shown]
    for sock in host_sockets():
        if any(_within(sock, p) for p in seen) or not any(_within(sock, m) for m in masked):
            args += ["--ro-bind", "/dev/null", str(sock)]
    # The grader's pid means nothing in the kernel's pid namespace (the kernel would think
    # its parent gone); --die-with-parent does that job.
    return args + ["--unsetenv", "JPY_PARENT_PID"]


def host_sockets() -> list[Path]:
    """The unix socket files bound on this host (/proc/net/unix; abstract ones are left
    behind by the sandbox's own network namespace)."""
    try:
        lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split(None, 7)
        if len(fields) == 8 and fields[7].startswith("/"):
            path = Path(fields[7])
            try:
                if stat.S_ISSOCK(path.lstat().st_mode) and path not in found:
                    found.append(path)
            except OSError:
                continue
    return found


def sandbox_env(scratch: Path) -> dict[str, str]:
    """The sandboxed kernel's whole environment (jupyter_client adds its JPY_ variables)."""
    env = {name: os.environ[name] for name in SANDBOX_ENV if name in os.environ}
    env.update(dict.fromkeys(("HOME", "TMPDIR", "MPLCONFIGDIR", "IPYTHONDIR"), str(scratch)))
    return env


def _needed() -> list[Path]:
    """What the kernel must see: Python, its packages and minidist."""
    import minidist

    return [Path(sys.prefix), Path(sys.base_prefix), Path(minidist.__file__).parents[1]]


def _within(inner: Path, outer: Path) -> bool:
    inner, outer = inner.resolve(), outer.resolve()
    return inner == outer or outer in inner.parents


def kernel_manager_class(prefix: list[str] | None, scratch: Path):
    """jupyter_client's kernel manager talking over ipc sockets in `scratch` (no TCP port:
    a sandbox has no network), its command prefixed by the sandbox's when `prefix` is given."""
    from jupyter_client.manager import AsyncKernelManager

    class GraderKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs):
            kwargs.update(transport="ipc", ip=str(scratch / "kernel"))
            kwargs["connection_file"] = str(scratch / "kernel.json")
            super().__init__(**kwargs)
            if prefix:  # a signal to bwrap's process group would not reach the kernel
                self.kernel_spec.interrupt_mode = "message"

        def format_kernel_cmd(self, extra_arguments=None):
            return (prefix or []) + super().format_kernel_cmd(extra_arguments)

    return GraderKernelManager
