"""The grader's side of the kernel (`grade_run` drives it): how a check cell is run so that
its verdict does not come from the learner's namespace, how a kernel is started (optionally
in a bubblewrap sandbox), and how every process it started is ended.

The verdict. A check cell is run as `check_cell_runner(source, token, slack)` builds it: the
modules the cell imports its `check_*` from (`minidist.zero.check`), and the course's checker
machinery, are dropped from `sys.modules`, so that the cell's own import loads them afresh
from disk (a learner's cell that reassigned `check_x`, or patched the module, is undone);
the checkers' world and in-process time limits are stretched by `slack` (room for a loaded
machine); the cell runs, and the runner, not the cell's printed text, reports whether it
raised: a display output of its own MIME type carrying a token the learner's code never saw
before this cell. "PASSED" printed by the learner, or a check cell that printed PASSED and
then raised, is not a pass.

This is not a security boundary: code in the same process as the checker can still patch
what the checker calls (torch, builtins). `--sandbox` bounds what it can reach.

Ending processes. The kernel starts in a session of its own (jupyter_client), and every
process it starts inherits the environment variable `RUN_MARKER` with a value unique to the
notebook's run. At the end the kernel's process group is killed, and then every process
still carrying the marker (a detached `sleep` in a new session included): a process that
both leaves the session and clears its environment escapes this sweep, not the sandbox's
pid namespace.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

VERDICT_MIME = "application/vnd.minidist.verdict+json"
RUN_MARKER = "MINIDIST_GRADE_RUN"
PING_TIMEOUT_S = 10
# Kept in a sandboxed kernel's environment (everything else is dropped).
SOCKET_DIRS = (Path("/run"), Path("/var/run"))  # where a host's services keep their sockets
SANDBOX_ENV = ("PATH", "LANG", "LC_ALL", "PYTHONPATH", "TRITON_INTERPRET", "OMP_NUM_THREADS")

RUNNER = r"""
def _minidist_check_{token}(source, slack, fresh):
    import sys
    from IPython import get_ipython
    from IPython.display import display
    for name in list(sys.modules):
        if any(name == f or name.startswith(f + ".") for f in fresh):
            del sys.modules[name]
    mine = any(f.startswith("minidist.") and f not in {machinery!r} for f in fresh)
    if slack != 1 and (mine or "minidist" in sys.modules):
        import minidist.course.catalogue as catalogue
        import minidist.course.failures as failures
        launch, time_limit = catalogue.launch, failures.time_limit
        def stretched_launch(*args, timeout_s=None, **kwargs):
            scaled = None if timeout_s is None else timeout_s * slack
            return launch(*args, timeout_s=scaled, **kwargs)
        catalogue.launch = stretched_launch
        failures.time_limit = lambda seconds: time_limit(seconds * slack)
    verdict = {{"token": "{token}", "passed": False, "error": None}}
    try:
        exec(compile(source, "<check cell>", "exec"), get_ipython().user_ns)
        verdict["passed"] = True
    except BaseException as exc:
        verdict["error"] = f"{{type(exc).__name__}}: {{exc}}"
        raise
    finally:
        display({{"{mime}": verdict}}, raw=True)
try:
    _minidist_check_{token}({source!r}, {slack!r}, {fresh!r})
finally:
    del _minidist_check_{token}
"""


MACHINERY = ("minidist.course.check", "minidist.course.failures", "minidist.course.catalogue")
CHECK_IMPORT = re.compile(r"^\s*from\s+([\w.]+)\s+import\b[^\n]*\bcheck_", re.M)


def check_cell_runner(source: str, token: str, slack: float) -> str:
    """The code the kernel runs in place of a check cell (see the module's docstring): the
    modules the check cell imports its checkers from, and the checkers' machinery, are
    imported afresh."""
    fresh = sorted(set(CHECK_IMPORT.findall(source)) | set(MACHINERY))
    return RUNNER.format(
        token=token, source=source, slack=slack, mime=VERDICT_MIME, fresh=fresh, machinery=MACHINERY
    )


def read_verdict(outputs: list, token: str) -> tuple[bool | None, list]:
    """(passed, or None when no verdict with this token came back; the other outputs)."""
    passed, rest = None, []
    for out in outputs:
        data = out.get("data", {}) if out.get("output_type") == "display_data" else {}
        if VERDICT_MIME in data:
            verdict = data[VERDICT_MIME]
            if isinstance(verdict, dict) and verdict.get("token") == token:
                passed = verdict.get("passed") is True
            continue
        rest.append(out)
    return passed, rest


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
    a pid namespace of its own (every process in it dies with the kernel); the kernel gets
    `sandbox_env` only."""
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
    # The grader's pid means nothing in the kernel's pid namespace (the kernel would think
    # its parent gone); --die-with-parent does that job.
    return args + ["--unsetenv", "JPY_PARENT_PID"]


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


def end_processes(pgid: int | None, marker: str) -> list[int]:
    """Kill the kernel's process group, then every process whose environment carries
    `RUN_MARKER=marker`; returns the pids killed by the sweep."""
    if pgid:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    needle = f"{RUN_MARKER}={marker}".encode()
    killed = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and int(entry.name) != os.getpid():
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                pass
    if killed:
        time.sleep(0.05)
    return killed
