"""The grader against a learner who cheats or leaves things behind: verdicts the cheap tricks
cannot forge (display hooks, `showtraceback`, stdout and `print`, the checker's module, a
checker of the learner's own through the import system, a file that shadows it, SystemExit
and KeyboardInterrupt, a printed or written verdict), no process of a notebook alive after
`grade` returns (with and without `--sandbox`), and the sandbox's home and host sockets
checked under bubblewrap itself."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_grade import CHECKER, LABCHECK, RIGHT, _json, _lab, _notebook, _rows

from minidist.__main__ import main
from minidist.course import grade, grade_kernel, grade_reap, grade_sandbox

WRONG = "def add(a, b):\n    return a * b"  # add(1, 2) gives 2
LATE_OK = (5, "def late():\n    pass")
FD = f"int(os.environ[{grade_kernel.VERDICT_FD!r}])"
VERDICT = '{"token": token, "passed": True, "error": None}'

FAKE = "def check_add(f):\n    print('PASSED: add(1, 2) == 3')\ndef check_late(f):\n    pass\n"
# Each runs before the answer, in the answer's cell; the class grades it with a wrong and a
# right add (and a right `late`, exercise 2, in both).
FORGERIES = {
    # the forgery: display rewrites the verdict, showtraceback hides the error
    "display": (
        "import IPython.display, IPython.core.display_functions as shown\n"
        "real = shown.display\n"
        "def display(*objs, **kw):\n"
        "    objs = [{k: dict(v, passed=True, error=None) if isinstance(v, dict) else v\n"
        "             for k, v in o.items()} if isinstance(o, dict) else o for o in objs]\n"
        "    return real(*objs, **kw)\n"
        "IPython.display.display = shown.display = display\n"
        "get_ipython().showtraceback = lambda *a, **k: print('PASSED: add(1, 2) == 3')\n"
        "get_ipython()._showtraceback = lambda *a, **k: None\n"
    ),
    "stdout": (
        "import builtins, sys\n"
        "class Liar:\n"
        "    def write(self, text):\n"
        "        return sys.__stdout__.write('PASSED: add(1, 2) == 3\\n')\n"
        "    def flush(self):\n"
        "        pass\n"
        "sys.stdout = sys.stderr = Liar()\n"
        "builtins.print = lambda *a, **k: sys.__stdout__.write('PASSED: forged\\n')\n"
    ),
    "module": (
        "import sys, labcheck\n"
        "labcheck.check_add = lambda f: print('PASSED: add(1, 2) == 3')\n"
        "sys.modules['labcheck'].check_add = labcheck.check_add\n"
        "check_add = labcheck.check_add\n"
    ),
    "printed": (
        "import json, uuid\n"
        "print(json.dumps({'token': uuid.uuid4().hex, 'passed': True, 'error': None}))\n"
        "display({'application/vnd.minidist.verdict+json': {'token': 'x', 'passed': True}},\n"
        "        raw=True)\n"
    ),
    "written": (
        "import json, os, uuid\n"
        "token = uuid.uuid4().hex\n"
        f"os.write({FD}, (json.dumps({VERDICT}) + '\\n').encode())\n"
        f"os.write({FD}, b'PASSED\\n')\n"
    ),
    # a checker of the learner's own through the import system: a finder on sys.meta_path,
    # a folder with an old-dated labcheck.py on sys.path, a patched __import__
    "finder": (
        "import sys, types, importlib.abc, importlib.util\n"
        "class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'labcheck':\n"
        "            return importlib.util.spec_from_loader(name, self)\n"
        "    def create_module(self, spec):\n"
        "        return None\n"
        "    def exec_module(self, module):\n"
        f"        exec({FAKE!r}, module.__dict__)\n"
        "sys.meta_path.insert(0, Finder())\n"
    ),
    "path": (
        "import os, sys, tempfile\n"
        "folder = tempfile.mkdtemp()\n"
        f"open(os.path.join(folder, 'labcheck.py'), 'w').write({FAKE!r})\n"
        "os.utime(os.path.join(folder, 'labcheck.py'), (0, 0))\n"
        "sys.path.insert(0, folder)\n"
    ),
    # a labcheck.py written beside the notebook, its folder put first on sys.path
    "shadow": (
        "import os, sys\n"
        "sys.path.insert(0, os.getcwd())\n"
        "open('labcheck.py', 'w').write(\n"
        "    'def check_add(f):\\n    print(\"PASSED: add(1, 2) == 3\")\\n'\n"
        "    'def check_late(f):\\n    print(\"PASSED\")\\n')\n"
    ),
    "import": (
        "import builtins, types\n"
        "fake, real = types.ModuleType('labcheck'), builtins.__import__\n"
        f"exec({FAKE!r}, fake.__dict__)\n"
        "builtins.__import__ = lambda name, *a, **k: (\n"
        "    fake if name == 'labcheck' else real(name, *a, **k))\n"
    ),
}
# Forgeries that no answer survives: a hook that reads this cell's token and writes a pass
# (the runner's own verdict comes too: two), the grader's record of the import system gone.
SPOILERS = {
    "hook": (
        "import json, os, re\n"
        "def forge(info):\n"
        "    for token in re.findall(r\"'([0-9a-f]{32})'\", info.raw_cell or ''):\n"
        f"        os.write({FD}, (json.dumps({VERDICT}) + '\\n').encode())\n"
        "get_ipython().events.register('pre_run_cell', forge)\n"
    ),
    "unrecorded": "import sys\nsys.modules.pop('_minidist_grade_imports', None)\n",
}
RAISERS = {
    "SystemExit": "def add(a, b):\n    raise SystemExit(0)",
    "KeyboardInterrupt": "def add(a, b):\n    raise KeyboardInterrupt",
}


@pytest.fixture(scope="module")
def forged_class(tmp_path_factory):
    root = tmp_path_factory.mktemp("forged")
    (root / "lib").mkdir()
    (root / "lib" / "labcheck.py").write_text(LABCHECK)
    released = root / "released"
    _lab(released)
    klass = root / "class"
    for name, trick in FORGERIES.items():
        _lab(klass / f"{name} wrong", (2, trick + WRONG), LATE_OK)
        _lab(klass / f"{name} right", (2, trick + RIGHT), LATE_OK)
    for name, trick in SPOILERS.items():
        _lab(klass / f"{name} right", (2, trick + RIGHT), LATE_OK)
    for name, answer in RAISERS.items():
        _lab(klass / f"{name} wrong", (2, answer), LATE_OK)
    csv_path = root / "grades.csv"
    argv = ["grade", "--class", str(klass), "--released", str(released), "--csv", str(csv_path)]
    mp = pytest.MonkeyPatch()
    mp.setenv("PYTHONPATH", f"{root / 'lib'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    try:
        main([*argv, "-j", "2", "--timeout", "60", "--json"])
    finally:
        mp.undo()
    return _rows(csv_path)


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_a_forgery_fails_a_wrong_answer_and_passes_a_right_one(forged_class, name):
    wrong = forged_class[(f"{name} wrong", "lab", "Exercise 1: add")]
    assert wrong[0] == "FAIL", wrong
    assert "add(1, 2) gave 2, expected 3" in wrong[1] or name == "stdout", wrong
    right = forged_class[(f"{name} right", "lab", "Exercise 1: add")]
    assert right[0] == "PASS", right
    for who in (f"{name} wrong", f"{name} right"):
        assert forged_class[(who, "lab", "Exercise 2: late")][0] == "PASS", who


def test_a_forged_channel_or_checker_fails_even_a_right_answer(forged_class):
    for exercise in ("Exercise 1: add", "Exercise 2: late"):
        hook = forged_class[("hook right", "lab", exercise)]
        assert hook == ("FAIL", grade_kernel.FORGED), hook


def test_the_grader_s_record_of_the_import_system_removed_fails_every_check(forged_class):
    for exercise in ("Exercise 1: add", "Exercise 2: late"):
        row = forged_class[("unrecorded right", "lab", exercise)]
        assert row == ("FAIL", "RuntimeError: the grader's record of the import system is gone")


@pytest.mark.parametrize("name", sorted(RAISERS))
def test_an_answer_raising_systemexit_or_keyboardinterrupt_fails(forged_class, name):
    row = forged_class[(f"{name} wrong", "lab", "Exercise 1: add")]
    assert row[0] == "FAIL" and row[1].startswith(name), row
    assert forged_class[(f"{name} wrong", "lab", "Exercise 2: late")][0] == "PASS"


def test_a_checker_that_never_returned_is_no_pass(tmp_path):
    """In a notebook graded by its own check cells (no released twin to restore them), a
    check cell that swallows its checker's failure, or an earlier cell that turns the
    runner's `exec` into a no-op, still fails: the verdict counts the checkers' returns."""
    swallowed = "try:\n    check_add(max)\nexcept AssertionError:\n    print('PASSED')"
    nb = _notebook(
        tmp_path / "own.ipynb",
        CHECKER,
        ("md", "## Exercise 1: swallowed"),
        ("code", swallowed),
        ("md", "## Exercise 2: no exec"),
        ("code", "exec = lambda *a, **k: None  # the runner's exec, in the learner's namespace"),
        ("code", "check_add(lambda a, b: a * b)"),
    )
    rows = grade.grade_notebook(nb, released=None)
    assert [(r.status, r.message) for r in rows] == [
        ("FAIL", "a checker did not return"),
        ("FAIL", "the check cell called no checker"),
    ]


CHAIN = """
import os, sys, time
tag, mode, end = sys.argv[1], sys.argv[2], float(sys.argv[3])
while time.time() < end:  # a new child in a new session, its parent gone, over and over
    if os.fork() == 0:
        os.setsid()
        if mode == "clear":  # without the run's marker
            os.execve(sys.executable, [sys.executable, *sys.argv], {})
        continue
    time.sleep(0.05)
    os._exit(0)
"""


def _alive(tag: str) -> list[str]:
    """The processes whose command line holds `tag`, zombies left out."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if tag in cmdline and state != "Z":
            found.append(f"{entry.name} {state} {cmdline!r}")
    return found


@pytest.mark.parametrize("sandbox", [False, True], ids=["plain", "sandbox"])
def test_a_forking_chain_does_not_outlive_the_grader(tmp_path, capsys, sandbox):
    """Two chains of processes that fork, leave their session and let their parent die,
    one keeping the run's marker and one clearing its environment, for 20 s: none is alive
    0.5 s after `grade` returns."""
    if sandbox and grade_sandbox.bwrap_problem():
        pytest.skip(grade_sandbox.bwrap_problem())
    (tmp_path / "chain.py").write_text(CHAIN)
    tag = f"chain-{os.getpid()}-{time.monotonic_ns()}"
    start = (
        "import subprocess, sys, time\n"
        "for mode in ('keep', 'clear'):\n"
        f"    args = [sys.executable, {str(tmp_path / 'chain.py')!r}, {tag!r}, mode]\n"
        "    subprocess.Popen([*args, str(time.time() + 20)], start_new_session=True)\n"
        "time.sleep(2)"
    )
    nb = _notebook(tmp_path / "chain.ipynb", CHECKER, ("code", start), ("code", "check_add(max)"))
    argv = ["grade", str(nb), "--json", "--timeout", "60"] + (["--sandbox"] if sandbox else [])
    assert main(argv) == grade.EXIT_FAILED
    assert _json(capsys)[0]["message"] == "AssertionError: add(1, 2) gave 2, expected 3"
    time.sleep(0.5)
    left = _alive(tag)
    for pid in (int(line.split()[0]) for line in left):  # the test's own clean-up
        subprocess.run(["kill", "-9", str(pid)], capture_output=True)
    assert left == [], left


def test_without_the_subreaper_the_kernels_process_group_is_still_killed(tmp_path, monkeypatch):
    """Elsewhere than on Linux the grader is no subreaper (`grade_reap`): an orphan left in
    the kernel's process group, its environment (the run's marker) dropped and its parent
    gone, is re-parented away from the grader, and only killing the kernel's group ends it."""
    import shutil

    monkeypatch.setattr(grade_reap, "_subreaper", lambda on: None)
    seconds = f"4323.{os.getpid()}{time.monotonic_ns() % 1000:03d}"
    orphan = [shutil.which("sh"), "-c", f"{shutil.which('sleep')} {seconds} &"]
    nb = _notebook(
        tmp_path / "orphan.ipynb",
        CHECKER,
        ("code", f"import subprocess\nsubprocess.run({orphan!r}, env={{}})"),
        ("code", "check_add(lambda a, b: a + b)"),
    )
    rows = grade.grade_notebook(nb, released=None)
    assert [r.status for r in rows] == ["PASS"]
    time.sleep(0.5)
    left = _alive(f"sleep\0{seconds}")
    for pid in (int(line.split()[0]) for line in left):  # the test's own clean-up
        subprocess.run(["kill", "-9", str(pid)], capture_output=True)
    assert left == [], left


def test_a_kernel_between_its_fork_and_exec_outlives_another_notebooks_end(tmp_path, monkeypatch):
    """With -j 2, notebook A ends while B's kernel starts. Between its fork and its exec
    B's kernel is a child of the grader with the grader's environment, no run marker: A's
    sweep took it for an orphan and killed it ("Kernel died before replying to kernel_info",
    make test under load 15). While a kernel starts, no unmarked child is swept; once none
    starts, an unmarked child of the grader is an orphan again and dies with the next end."""
    env = {k: v for k, v in os.environ.items() if k != grade_reap.RUN_MARKER}
    with grade_reap.reaping("a"), grade_reap.reaping("b"):
        with grade_reap.starting("b"):
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
            try:
                assert child.pid not in grade_reap.end_run("a", None, None)
                assert child.poll() is None  # B's kernel-to-be lives on
            except BaseException:
                child.kill()
                raise
        assert child.pid in grade_reap.end_run("a", None, None)  # nobody's: an orphan
        assert not Path(f"/proc/{child.pid}").exists()  # killed and reaped by the sweep
    # and the grader declares each kernel's start
    real, declared = grade_reap.starting, []

    @contextlib.contextmanager
    def declare(marker):
        with real(marker):
            declared.append(marker)
            yield

    monkeypatch.setattr(grade_reap, "starting", declare)
    nb = _notebook(tmp_path / "one.ipynb", CHECKER, ("code", "check_add(lambda a, b: a + b)"))
    assert [r.status for r in grade.grade_notebook(nb, released=None)] == ["PASS"]
    assert len(declared) == 1


def test_the_sandbox_hides_a_home_holding_python_and_covers_host_sockets(tmp_path):
    """Under bubblewrap for real: the grader's Python lives in a venv under the home; the
    kernel sees the venv and nothing else of the home, and cannot connect to a host's unix
    socket beside the notebook or in /var/tmp. The same notebook without --sandbox does (the
    test can fail)."""
    import socket
    import tempfile

    if grade_sandbox.bwrap_problem():
        pytest.skip(grade_sandbox.bwrap_problem())
    if not os.access("/var/tmp", os.W_OK):
        pytest.skip("needs a writable /var/tmp (a folder the sandbox leaves visible)")
    base = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="minidist-home-"))
    try:
        home, work = base / "home", base / "work"
        (home / ".ssh").mkdir(parents=True)
        (home / ".ssh" / "id_ed25519").write_text("secret")
        work.mkdir()
        venv = home / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        listeners = []
        for path in (work / "beside.sock", base / "host.sock"):
            listener = socket.socket(socket.AF_UNIX)
            listener.bind(str(path))
            listener.listen()
            listeners.append(listener)
        check = (
            "code",
            "import os, socket\n"
            "def check_hidden(home, sockets):\n"
            "    assert os.listdir(home) == ['venv'], os.listdir(home)\n"
            "    for path in sockets:\n"
            "        s = socket.socket(socket.AF_UNIX)\n"
            "        try:\n"
            "            s.connect(path)\n"
            "        except OSError:\n"
            "            continue\n"
            "        raise AssertionError(f'connected to {path}')\n"
            "    print('PASSED: hidden')",
        )
        sockets = [str(work / "beside.sock"), str(base / "host.sock")]
        nb = _notebook(
            work / "h.ipynb", check, ("code", f"check_hidden({str(home)!r}, {sockets!r})")
        )
        site = [p for p in sys.path if p.endswith("site-packages")]
        root = Path(grade.__file__).resolve().parents[2]
        env = dict(os.environ, HOME=str(home), PYTHONPATH=os.pathsep.join([str(root), *site]))
        python = str(venv / "bin" / "python")
        got = {}
        for flag in (["--sandbox"], []):
            out = subprocess.run(
                [python, "-m", "minidist", "grade", str(nb), "--json", *flag],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            got[bool(flag)] = json.loads(out.stdout)[0]["message"] if out.stdout else out.stderr
        assert got[True] == "PASSED: hidden", got
        assert got[False].startswith("AssertionError: ["), got  # .ssh is listed without it
    finally:
        subprocess.run(["rm", "-rf", str(base)])


def test_a_checker_planted_with_an_old_date_fails_this_and_every_later_notebook(tmp_path):
    """A notebook that writes a fake labcheck.py, dated years back, into a folder on the
    kernels' sys.path (site-packages, without the sandbox): its checks and those of every
    notebook graded after it load a file changed since grading began, and fail."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "labcheck.py").write_text(LABCHECK)
    early = tmp_path / "early"  # on sys.path before lib, writable
    early.mkdir()
    _lab(tmp_path / "released")
    plant = (
        "import os\n"
        f"path = os.path.join({str(early)!r}, 'labcheck.py')\n"
        f"open(path, 'w').write({FAKE!r})\n"
        "os.utime(path, (0, 0))\n"
    )
    klass = tmp_path / "class"
    _lab(klass / "a planter", (2, plant + WRONG), LATE_OK)
    _lab(klass / "b next", (2, WRONG), LATE_OK)
    csv_path = tmp_path / "g.csv"
    argv = ["grade", "--class", str(klass), "--released", str(tmp_path / "released")]
    mp = pytest.MonkeyPatch()
    path = os.pathsep.join([str(early), str(tmp_path / "lib"), os.environ.get("PYTHONPATH", "")])
    mp.setenv("PYTHONPATH", path)
    try:
        main([*argv, "--csv", str(csv_path), "--timeout", "60", "--json"])
    finally:
        mp.undo()
    rows = _rows(csv_path)
    for who in ("a planter", "b next"):
        for exercise in ("Exercise 1: add", "Exercise 2: late"):
            row = rows[(who, "lab", exercise)]
            assert row[0] == "FAIL" and "a file the submission brought or wrote" in row[1], row
