"""`grade --sandbox`: the bubblewrap command a kernel runs under, and its environment. No
network; the file tree read-only except the kernel's scratch folder and a fresh /tmp; the
instructor's home, the other learners' folders and /run hidden (Python and minidist shown
again when they live there); every unix socket the host has bound covered; a pid namespace
of its own that dies with the kernel. What stays visible: the rest of the file tree, read
only, and a socket bound after the kernel started.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

SOCKET_DIRS = (Path("/run"), Path("/var/run"))  # where a host's services keep their sockets
# Kept in a sandboxed kernel's environment (everything else is dropped).
SANDBOX_ENV = ("PATH", "LANG", "LC_ALL", "PYTHONPATH", "TRITON_INTERPRET", "OMP_NUM_THREADS")


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
