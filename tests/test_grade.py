"""`python -m minidist grade`: stubs fail, solutions pass, hangs and crashed kernels are reported.

The shipped notebooks are graded for one lesson (00, the quickest); `make` users grade the
whole course with `python -m minidist grade --all solutions` (figures in the README). The
timeout and crash cases run on small synthetic notebooks.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from minidist.__main__ import main
from minidist.course import grade, grade_kernel, grade_sandbox
from minidist.course.exercises import STUB
from minidist.course.grade_run import NO_VERDICT

ROOT = Path(__file__).resolve().parents[1]
LESSON = "00_world_and_collectives.ipynb"


def test_shipped_exercises_fail_with_the_stub_message_and_solutions_pass():
    stubs = grade.grade_notebook(ROOT / "exercises" / LESSON)
    answers = grade.grade_notebook(ROOT / "solutions" / LESSON)
    assert [r.exercise for r in stubs] == [r.exercise for r in answers]
    assert [r.exercise for r in stubs] == [
        "Exercise 1: ring all-reduce",
        "Exercise 2: ring all-gather",
    ]
    for r in stubs:
        assert not r.passed and r.message.startswith("NotImplementedError: "), r
        assert "not implemented yet" in r.message or STUB.split('"')[1] in r.message, r
    for r in answers:
        assert r.passed and r.message.startswith("PASSED: "), r


def _notebook(path: Path, *cells: tuple[str, str]) -> Path:
    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})
    nb.cells = [new_markdown_cell(s) if kind == "md" else new_code_cell(s) for kind, s in cells]
    nbformat.write(nb, path)
    return path


CHECKER = (
    "code",
    "import os, signal, time\n"
    "def check_add(add):\n"
    "    assert add(1, 2) == 3, f'add(1, 2) gave {add(1, 2)}, expected 3'\n"
    "    print('PASSED: add(1, 2) == 3')",
)


DIES = (  # a kernel that exits inside its first check, and the exercise after it
    ("md", "## Exercise 1: the kernel dies"),
    ("code", "check_add(lambda a, b: os._exit(1))"),
    ("md", "## Exercise 2: never reached"),
    ("code", "check_add(lambda a, b: a + b)"),
)


def test_timeouts_crashes_and_the_cli(tmp_path, capsys, monkeypatch):
    # Limits by the clock (the grader's are: a sleeping cell uses no CPU) that a cell of
    # microseconds meets at load 20: 3 s and a 2 s ping failed "right" at load 13
    monkeypatch.setattr(grade_kernel, "PING_TIMEOUT_S", 5)
    first = _notebook(
        tmp_path / "a.ipynb",
        CHECKER,
        ("md", "## Exercise 1: right"),
        ("code", "add = lambda a, b: a + b"),
        ("code", "check_add(add)"),
        ("md", "## Exercise 2: wrong"),
        ("code", "check_add(lambda a, b: a * b)"),
        ("md", "## Exercise 3: hangs, then is interrupted"),
        ("code", "time.sleep(600)\ncheck_add(add)"),
        ("md", "## Exercise 4: the kernel still answers"),
        ("code", "check_add(add)"),
    )
    crash = _notebook(
        tmp_path / "b.ipynb",
        CHECKER,
        *DIES,
    )
    deaf = _notebook(
        tmp_path / "c.ipynb",
        CHECKER,
        ("md", "## Exercise 1: ignores the interrupt"),
        ("code", "signal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(600)\ncheck_add(max)"),
        ("md", "## Exercise 2: never reached"),
        ("code", "check_add(lambda a, b: a + b)"),
    )
    after = _notebook(tmp_path / "d.ipynb", CHECKER, ("code", "check_add(lambda a, b: a + b)"))
    argv = ["grade", str(first), str(crash), str(deaf), str(after), "--timeout", "8", "--json"]
    status = main(argv)
    got = [(r["notebook"], r["exercise"], r["passed"], r["message"]) for r in _json(capsys)]
    assert status == grade.EXIT_FAILED
    n = [str(p) for p in (first, crash, deaf, after)]
    assert got[:4] == [
        (n[0], "Exercise 1: right", True, "PASSED: add(1, 2) == 3"),
        (n[0], "Exercise 2: wrong", False, "AssertionError: add(1, 2) gave 2, expected 3"),
        (n[0], "Exercise 3: hangs, then is interrupted", False, HUNG),
        (n[0], "Exercise 4: the kernel still answers", True, "PASSED: add(1, 2) == 3"),
    ]
    assert got[4:6] == [
        (n[1], "Exercise 1: the kernel dies", False, "the kernel died while running cell 2"),
        (n[1], "Exercise 2: never reached", False, "not run: the kernel died while running cell 2"),
    ]
    reason = "cell 2 hung past 8 s and ignored the interrupt"
    assert got[6:8] == [
        (n[2], "Exercise 1: ignores the interrupt", False, reason),
        (n[2], "Exercise 2: never reached", False, f"not run: {reason}"),
    ]
    assert got[8] == (n[3], "check cell 1", True, "PASSED: add(1, 2) == 3")


HUNG = (
    "the cell ran past the 8 s per-cell timeout and was interrupted (a loop that never "
    "ends, or a rank waiting for a message no rank sends?)"
)


def _json(capsys) -> list[dict]:
    return json.loads(capsys.readouterr().out)


def test_a_kernel_whose_death_is_seen_only_after_the_timeout_died_and_did_not_hang(
    tmp_path, monkeypatch
):
    """On a loaded machine nbclient's poll for a dead kernel can come after the cell's
    timeout (make test at load 12: "hung past 8 s"); here the poll never sees it. The
    kernel's process has ended: the row says it died, not that it ignored the interrupt."""
    from nbclient import NotebookClient

    async def never_sees_it(self):
        return None

    monkeypatch.setattr(NotebookClient, "_async_check_alive", never_sees_it)
    monkeypatch.setattr(grade_kernel, "PING_TIMEOUT_S", 2)
    nb = _notebook(
        tmp_path / "dies.ipynb",
        CHECKER,
        *DIES,
    )
    rows = grade.grade_notebook(nb, timeout_s=3, released=None)
    assert [(r.status, r.message) for r in rows] == [
        ("FAIL", "the kernel died while running cell 2"),
        ("FAIL", "not run: the kernel died while running cell 2"),
    ]


def test_a_notebook_without_minidist_is_graded_without_importing_torch(tmp_path):
    """The checker machinery is dropped and re-imported only as a checker imports it: a
    notebook whose checkers do not use minidist never imports torch (2 core-s a kernel)."""
    checker = (
        "code",
        "import sys\n"
        "def check_add(add):\n"
        "    assert add(1, 2) == 3\n"
        "    print('PASSED; torch imported:', 'torch' in sys.modules)",
    )
    nb = _notebook(
        tmp_path / "lab.ipynb",
        checker,
        ("md", "## Exercise 1: add"),
        ("code", "check_add(lambda a, b: a + b)"),
    )
    (row,) = grade.grade_notebook(nb, released=None)
    assert (row.status, row.message) == ("PASS", "PASSED; torch imported: False")


def test_table_and_usage_errors(tmp_path, capsys):
    """Usage errors: one line on stderr and exit status 2, before anything runs; a folder of
    notebooks with no exercises is a warning, not a pass."""
    nb = _notebook(tmp_path / "x.ipynb", CHECKER, ("code", "check_add(lambda a, b: 0)"))
    assert main(["grade", "--all", str(tmp_path)]) == grade.EXIT_FAILED
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["notebook", "exercise", "result", "time", "message"]
    assert table[1].startswith(str(nb)) and " FAIL " in table[1]
    assert table[1].endswith("AssertionError: add(1, 2) gave 0, expected 3")
    assert table[-1].startswith("1 exercises: 0 passed, 1 failed")
    (tmp_path / "script.py").write_text("print(1)\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = {
        ("--timeout", "0"): "--timeout 0: must be a number of seconds > 0",
        ("--timeout", "nan"): "--timeout nan: must be a number of seconds > 0",
        ("--timeout=-inf",): "--timeout -inf: must be a number of seconds > 0",
        (str(tmp_path / "nope.ipynb"),): "nope.ipynb: no such notebook",
        (str(tmp_path / "script.py"),): "script.py: must be a .ipynb notebook",
        (str(tmp_path),): "is a folder; grade it with --all",
        ("--all", str(nb)): "must be a folder of .ipynb notebooks",
        ("--all", str(empty)): "the folder holds no .ipynb notebooks",
        ("--class", str(empty)): "holds no student folders",
        ("--class", str(nb)): "must be a folder of student folders",
        ("-j", "0"): "-j 0: must be >= 1",
        ("--slack", "0.5"): "--slack 0.5: must be a factor >= 1",
        (): "give notebooks to grade, --all DIR or --class DIR",
    }
    for args, said in refused.items():
        extra = [str(nb)] if args and args[0].startswith(("--timeout", "-j", "--slack")) else []
        assert main(["grade", *extra, *args]) == grade.EXIT_USAGE, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("minidist grade: error: "), (args, err)
        assert said in err[0], (args, err)
    plain = _notebook(empty / "notes.ipynb", ("md", "# no exercise here"), ("code", "1 + 1"))
    assert main(["grade", "--all", str(empty)]) == grade.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"warning: {plain} holds no exercises" in err and "nothing graded" in err


def test_outputs_never_overwrite_a_submission(tmp_path, capsys, monkeypatch):
    """--feedback that is, holds or lies inside the class folder, or that would put an
    executed copy over a graded notebook, and --csv into a missing folder: one line, status 2,
    before any notebook runs, every submission as it was."""
    klass = tmp_path / "class"
    for who in ("alice", "bob"):
        (klass / who).mkdir(parents=True)
        _notebook(klass / who / "lab.ipynb", CHECKER, ("code", "check_add(max)"))
    single = _notebook(tmp_path / "lab.ipynb", CHECKER, ("code", "check_add(max)"))
    (tmp_path / "other").mkdir()
    twin = _notebook(tmp_path / "other" / "lab.ipynb", CHECKER, ("code", "check_add(max)"))
    graded = []

    def fake_grade_one(path, *args):
        graded.append(path)
        executed = nbformat.read(path, as_version=4)
        executed.cells.append(new_code_cell("executed"))
        return [grade.Result(str(path), "x", "FAIL", "no", 0.0)], executed

    monkeypatch.setattr(grade, "grade_one", fake_grade_one)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*.ipynb")}
    c = ["--class", str(klass)]
    refused = {
        (*c, "--feedback", str(klass)): "is the class folder",
        (*c, "--feedback", str(tmp_path)): "holds the class folder",
        (*c, "--feedback", str(klass / "alice")): "lies inside the class folder",
        (*c, "--feedback", str(klass / "new")): "lies inside the class folder",
        (str(single), "--feedback", str(tmp_path)): "would overwrite the graded notebook",
        ("--all", str(tmp_path), "--feedback", str(tmp_path)): "would overwrite the graded",
        (str(single), str(twin), "--feedback", str(tmp_path / "fb")): "would both be written",
        (str(single), "--feedback", str(single)): "exists and is not a folder",
        (*c, "--csv", str(tmp_path / "missing" / "g.csv")): "does not exist",
        (*c, "--csv", str(tmp_path)): "is a folder",
        (str(single), "--csv", str(single)): "is a notebook being graded",
    }
    for args, said in refused.items():
        assert main(["grade", *args]) == grade.EXIT_USAGE, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("minidist grade: error: "), (args, err)
        assert said in err[0], (args, err)
    assert graded == []  # refused before any notebook ran
    assert {p: p.read_bytes() for p in tmp_path.rglob("*.ipynb")} == before
    feedback = tmp_path / "feedback"
    assert main(["grade", *c, "--feedback", str(feedback), "--csv", str(tmp_path / "g.csv")]) == 1
    assert sorted(p.relative_to(feedback).as_posix() for p in feedback.rglob("*.ipynb")) == [
        "alice/lab.ipynb",
        "bob/lab.ipynb",
    ]
    assert {p: p.read_bytes() for p in before} == before


NAMELESS = (
    "from IPython import get_ipython\n"
    "k = get_ipython().kernel  # a stream message with no 'name', sent by hand\n"
    "k.session.send(k.iopub_socket, 'stream', {'text': 'x'}, parent=k.get_parent())"
)
DEEP = (
    "import os\nfrom ipykernel import get_connection_file\n"
    "os.chdir(os.path.dirname(get_connection_file()))  # the grader's scratch folder\n"
    "for _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\nos.chdir('/')"
)


def test_one_learner_never_stops_the_class(tmp_path, capsys, monkeypatch, request):
    """Whatever a learner's notebook does, every other student is graded and every row is
    one row: a malformed kernel message, a folder tree 3,000 deep left in the grader's
    scratch folder, a 1 MB message (capped, the whole text in the executed notebook), names
    that are formulas, hold a newline or differ only in Unicode normalisation."""
    # The grader's scratch folders (each kernel's sockets) in a folder of their own with a
    # short path: a socket's path must fit AF_UNIX's 107 bytes, and pytest's tmp_path is
    # longer under pytest-xdist. Whatever the grader leaves, GNU rm removes at any depth
    # (pytest's own cleanup of old temporary folders would meet the RecursionError).
    scratch = Path(tempfile.mkdtemp(prefix="minidist-test-"))
    request.addfinalizer(lambda: subprocess.run(["rm", "-rf", str(scratch)]))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    klass = tmp_path / "class"
    right = ("code", "check_add(lambda a, b: a + b)")
    huge = ("code", "check_add(lambda a, b: 'x' * 1_000_000)")
    learners = {
        "=HYPERLINK(1)": [CHECKER, ("code", NAMELESS), right],
        "nameless check": [CHECKER, ("code", "check_add(lambda a, b: a + b)\n" + NAMELESS)],
        "deep": [CHECKER, ("code", DEEP), right],
        "huge": [CHECKER, huge],
        "two\nlines": [CHECKER, right],
        "caf\u00e9": [CHECKER, right],
        "cafe\u0301": [CHECKER, right],
    }
    for who, cells in learners.items():
        (klass / who).mkdir(parents=True)
        _notebook(klass / who / "lab.ipynb", *cells)
    table_csv, feedback = tmp_path / "g.csv", tmp_path / "feedback"
    argv = ["grade", "--class", str(klass), "--csv", str(table_csv), "--feedback", str(feedback)]
    assert main([*argv, "-j", "2", "--timeout", "60"]) == grade.EXIT_FAILED
    out = capsys.readouterr().out.splitlines()
    with open(table_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    by = {r["student"]: r for r in rows}
    assert sorted(by) == sorted(["'=HYPERLINK(1)", *list(learners)[1:]]), rows  # everyone
    assert len(rows) == len(learners), rows
    assert by["'=HYPERLINK(1)"]["status"] == "PASS", rows  # the malformed message is ignored
    assert by["nameless check"]["status"] == "FAIL", rows
    assert "MalformedKernelMessage" in by["nameless check"]["message"], rows
    assert by["deep"]["status"] == "PASS", rows
    assert by["huge"]["status"] == "FAIL" and len(by["huge"]["message"]) < 2200
    assert "more characters: see the executed notebook" in by["huge"]["message"]
    executed = (feedback / "huge" / "lab.ipynb").read_text()
    assert "x" * 1_000_000 in executed  # the whole message, where the row points
    assert list(scratch.iterdir()) == []  # every scratch folder, at any depth, gone
    table = out[1 : 1 + len(learners)]
    assert all(" PASS " in line or " FAIL " in line for line in table)  # one line per row
    assert any(line.startswith("'two\\nlines'/lab.ipynb") for line in table)
    assert any(line.startswith("'cafe\\u0301'/lab.ipynb") for line in table)
    assert any(line.startswith("caf\u00e9/lab.ipynb") for line in table)


def test_a_kernel_that_cannot_start_is_a_row_and_leaves_no_socket_open(
    tmp_path, capsys, monkeypatch
):
    """A scratch folder whose socket paths pass AF_UNIX's 107 bytes: the kernel does not
    start, its exercise is an ERROR row that says why, and the zmq context it leaves is
    closed (left open with the failed socket in it, the garbage collector meeting both would
    wait forever in the context's finalizer, stopping the grader at a random line)."""
    import gc

    import zmq

    nb = _notebook(tmp_path / "lab.ipynb", CHECKER, ("code", "check_add(max)"))
    deep = tmp_path / ("x" * 120)
    deep.mkdir()
    before = [o for o in gc.get_objects() if isinstance(o, zmq.Context)]
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    assert main(["grade", str(nb), "--timeout", "20", "--json"]) == grade.EXIT_FAILED
    monkeypatch.setattr(tempfile, "tempdir", None)
    (row,) = _json(capsys)
    assert row["status"] == "ERROR" and "the kernel did not start" in row["message"]
    left = [o for o in gc.get_objects() if isinstance(o, zmq.Context)]
    assert all(o.closed for o in left if not any(o is b for b in before))


def test_csv_fields_are_neutralised_as_owasp_says():
    from minidist.course.grade_class import spreadsheet_safe

    for text in ("=cmd|' /C calc'!A0", "+1", "-2+3", "@SUM(A1)", "\tx", "\rx"):
        assert spreadsheet_safe(text) == "'" + text
    for text in ("AssertionError: -1", "PASSED: 3", "", "'quoted"):
        assert spreadsheet_safe(text) == text


LABCHECK = """
def check_add(add):
    got = add(1, 2)
    assert got == 3, f"add(1, 2) gave {got}, expected 3\\n(check the operator)"
    print("PASSED: add(1, 2) == 3")


def check_late(f):
    print("PASSED: looks right so far")
    f()
"""
RELEASED = (
    ("md", "# Lab"),
    ("md", "## Exercise 1: add"),
    ("code", "def add(a, b):\n    raise NotImplementedError"),
    ("code", "from labcheck import check_add\n\ncheck_add(add)"),
    ("md", "## Exercise 2: late"),
    ("code", "def late():\n    raise NotImplementedError"),
    ("code", "from labcheck import check_late\n\ncheck_late(late)"),
)
RIGHT = "def add(a, b):\n    return a + b"
SLEEPER = f"sleep 4321.{os.getpid()}"  # a detached process the grader must end
# An orphan in the kernel's process group that dropped its environment (no run marker, and
# the kernel no longer knows it as a child): only killing the kernel's group ends it.
GROUPED = f"sleep 4322.{os.getpid()}"


def _lab(folder: Path, *replace: tuple[int, str], drop: int | None = None) -> Path:
    """The released lab with some cells replaced by a learner's (index, source)."""
    cells = [list(c) for c in RELEASED]
    for index, source in replace:
        cells[index][1] = source
    if drop is not None:
        del cells[drop]
    folder.mkdir(parents=True, exist_ok=True)
    return _notebook(folder / "lab.ipynb", *map(tuple, cells))


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    """A class of realistic submissions graded once with --class, -j 2, CSV and feedback:
    right, wrong, broken, forged, missing and one leaving a process behind."""
    root = tmp_path_factory.mktemp("class")
    (root / "lib").mkdir()
    (root / "lib" / "labcheck.py").write_text(LABCHECK)
    released = root / "released"
    _lab(released)
    klass = root / "class"
    late_ok = (5, "def late():\n    pass")
    _lab(klass / "alice", (2, RIGHT), late_ok)
    forged = (
        "import labcheck\nlabcheck.check_add = lambda f: print('PASSED: forged')\n"
        "check_add = labcheck.check_add\ndef add(a, b):\n    return a - b"
    )
    _lab(klass / "bob", (2, forged), (5, "def late():\n    raise ValueError('after PASSED')"))
    wrapped = "try:\n    check_add(add)\nexcept Exception:\n    print('PASSED: trust me')"
    _lab(klass / "carol", (2, "def add(a, b):\n    return a * b"), (3, wrapped), late_ok)
    _lab(klass / "dave", (2, RIGHT), drop=6)
    (klass / "dave" / "broken.ipynb").write_text('{"cells": [')
    _lab(klass / "erin", (2, "def add(a, b)\n    return a + b"), late_ok)
    _lab(klass / "frank", (2, "import no_such_module\n" + RIGHT), late_ok)
    detach = (
        f"import subprocess\nsubprocess.Popen({SLEEPER.split()!r}, start_new_session=True)\n"
        + RIGHT
    )
    _lab(klass / "gina", (2, detach), late_ok)
    silence = f"import os\nos.close(int(os.environ[{grade_kernel.VERDICT_FD!r}]))\n"
    _lab(klass / "ivan", (2, silence + RIGHT), late_ok)  # the verdict never comes back
    orphan = [shutil.which("sh"), "-c", f"{shutil.which('sleep')} {GROUPED.split()[1]} &"]
    _lab(klass / "judy", (2, f"import subprocess\nsubprocess.run({orphan!r}, env={{}})\n" + RIGHT))
    forged = "from labcheck import check_add\n\ncheck_add(lambda a, b: a + b)"
    wrong = "def add(a, b):\n    return a * b"
    _lab(klass / "kate", (2, wrong), (3, forged)).rename(klass / "kate" / "my lab.ipynb")
    mention = "# my answer; the cell below runs check_add(add) on it\n" + RIGHT
    _lab(klass / "liam", (2, mention), late_ok)
    (klass / "henry").mkdir()  # submitted nothing
    csv_path, feedback = root / "grades.csv", root / "feedback"
    argv = ["grade", "--class", str(klass), "--released", str(released), "--csv", str(csv_path)]
    argv += ["--feedback", str(feedback), "-j", "2", "--timeout", "60", "--json"]
    mp = pytest.MonkeyPatch()
    mp.setenv("PYTHONPATH", f"{root / 'lib'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    try:
        status = main(argv)
    finally:
        mp.undo()
    return status, csv_path, feedback, klass


def _rows(csv_path: Path) -> dict[tuple[str, str, str], tuple[str, str]]:
    with open(csv_path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["student", "lesson", "exercise", "status", "message", "seconds"]
    assert all(len(r) == 6 for r in rows)  # a multi-line message stays in its row
    return {(r[0], r[1], r[2]): (r[3], r[4]) for r in rows[1:]}


def test_class_rows_csv_and_feedback(graded_class):
    status, csv_path, feedback, _ = graded_class
    assert status == grade.EXIT_FAILED
    rows = _rows(csv_path)
    ex1, ex2 = "Exercise 1: add", "Exercise 2: late"
    assert rows[("alice", "lab", ex1)] == ("PASS", "PASSED: add(1, 2) == 3")
    assert rows[("alice", "lab", ex2)] == ("PASS", "PASSED: looks right so far")
    assert rows[("gina", "lab", ex1)][0] == "PASS"
    assert rows[("liam", "lab", ex1)] == ("PASS", "PASSED: add(1, 2) == 3")  # a mention
    # the checker's multi-line message, whole
    assert rows[("carol", "lab", ex1)][1].endswith(
        "AssertionError: add(1, 2) gave 2, expected 3\n(check the operator)"
    )
    assert rows[("dave", "lab", ex2)][0] == "FAIL"
    assert "check cell of this exercise is missing" in rows[("dave", "lab", ex2)][1]
    assert rows[("dave", "broken", "(the whole notebook)")][0] == "ERROR"
    assert "not JSON" in rows[("dave", "broken", "(the whole notebook)")][1]
    assert rows[("henry", "", "(no notebooks)")][0] == "ERROR"
    assert len(rows) == 2 * 11 + 2  # every exercise of every lab, the broken file, henry
    executed = json.loads((feedback / "alice" / "lab.ipynb").read_text())
    outputs = [o for c in executed["cells"] for o in c.get("outputs", [])]
    assert any("PASSED: add(1, 2) == 3" in "".join(o.get("text", "")) for o in outputs)
    assert not any("_minidist_check" in "".join(c["source"]) for c in executed["cells"])


def test_class_forged_passes_fail(graded_class):
    """Rebinding the checker (the name and the module's attribute), a check cell wrapped in
    try/except printing PASSED, a checker that printed PASSED and then raised, a renamed
    notebook whose check cell checks something else, a verdict that never came: all FAIL."""
    rows = _rows(graded_class[1])
    bob1, bob2 = rows[("bob", "lab", "Exercise 1: add")], rows[("bob", "lab", "Exercise 2: late")]
    assert bob1[0] == "FAIL" and "add(1, 2) gave -1, expected 3" in bob1[1], bob1
    assert bob2 == ("FAIL", "ValueError: after PASSED"), bob2
    carol = rows[("carol", "lab", "Exercise 1: add")]
    assert carol[0] == "FAIL", carol
    assert carol[1].startswith("[check cell modified: graded with the released one] ")
    kate = rows[("kate", "my lab", "Exercise 1: add")]  # renamed: graded by its exercises
    assert kate[0] == "FAIL", kate
    assert kate[1].startswith("[check cell modified: graded with the released one] ")
    assert "add(1, 2) gave 2, expected 3" in kate[1]
    for exercise in ("Exercise 1: add", "Exercise 2: late"):  # PASSED printed, no verdict
        ivan = rows[("ivan", "lab", exercise)]
        assert ivan == ("FAIL", NO_VERDICT), ivan


def test_class_earlier_errors(graded_class):
    """A SyntaxError or ModuleNotFoundError in an earlier cell is named in the failing row."""
    rows = _rows(graded_class[1])
    erin, frank = (rows[(who, "lab", "Exercise 1: add")] for who in ("erin", "frank"))
    assert erin[0] == "FAIL" and "an earlier cell failed first (cell 2: SyntaxError" in erin[1]
    assert erin[1].endswith("then NameError: name 'add' is not defined"), erin
    assert "(cell 2: ModuleNotFoundError: No module named 'no_such_module')" in frank[1], frank
    assert rows[("erin", "lab", "Exercise 2: late")][0] == "PASS"


def test_class_leaves_no_process(graded_class):
    """A learner's detached process (a new session), or one left in the kernel's process
    group without the run's marker, does not outlive the grader."""
    for sleeper in (SLEEPER, GROUPED):
        alive = subprocess.run(["pgrep", "-f", sleeper], capture_output=True, text=True).stdout
        assert alive == "", f"the learner's process {sleeper!r} outlived the grader: {alive}"


def test_a_cell_calling_the_checker_before_the_check_cell_is_not_taken_for_it(tmp_path):
    """A learner who tries the checker in the answer's cell (a call, not a mention) keeps the
    unchanged check cell after it as the exercise's; the first calling cell is taken only
    when the unchanged one is gone. Parent-side: the plan, no kernel."""
    from minidist.course.grade_run import plan

    released = _lab(tmp_path / "released").parent
    tried = "from labcheck import check_add\n" + RIGHT + "\ncheck_add(add)  # trying it"
    kept = _lab(tmp_path / "class" / "mia", (2, tried))
    _, rows, by_released = plan(kept, released)
    assert by_released
    assert [(index, modified) for index, _, modified in rows] == [(3, False), (6, False)]
    edited = _lab(tmp_path / "class" / "noah", (2, tried), (3, "check_add(add)"))
    _, rows, _ = plan(edited, released)
    assert [(index, modified) for index, _, modified in rows] == [(2, True), (6, False)]


SANDBOX_CHECK = (
    "code",
    "import os, socket\n"
    "def check_sandbox(port, folder):\n"
    "    try:\n"
    "        open(os.path.join(folder, 'escaped.txt'), 'w').close()\n"
    "    except OSError:\n"
    "        pass\n"
    "    else:\n"
    "        raise AssertionError('wrote beside the notebook')\n"
    "    s = socket.socket()\n"
    "    s.settimeout(2)\n"
    "    try:\n"
    "        s.connect(('127.0.0.1', port))\n"
    "    except OSError:\n"
    "        pass\n"
    "    else:\n"
    '        raise AssertionError("reached the grader\'s network")\n'
    "    assert 'MINIDIST_SECRET' not in os.environ, 'the environment was not scrubbed'\n"
    "    open(os.path.join(os.environ['TMPDIR'], 'scratch'), 'w').close()\n"
    "    print('PASSED: sandboxed')",
)


def test_sandbox(tmp_path, capsys, monkeypatch):
    """--sandbox: no file written beside the notebook, no network, a scrubbed environment,
    a writable temporary folder, a cell past the timeout interrupted; the same notebook
    without it escapes (the test can fail)."""
    problem = grade_sandbox.bwrap_problem()
    if problem:
        pytest.skip(f"bubblewrap cannot run here: {problem}")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    monkeypatch.setenv("MINIDIST_SECRET", "instructor's token")
    check = ("code", f"check_sandbox({port}, {str(tmp_path)!r})")
    hang = ("code", "import time\ntime.sleep(600)\ncheck_sandbox(0, '/')")
    nb = _notebook(tmp_path / "s.ipynb", SANDBOX_CHECK, check, hang, check)
    try:
        argv = ["grade", str(nb), "--sandbox", "--json", "--timeout", "8"]
        assert main(argv) == grade.EXIT_FAILED
        got = [r["message"] for r in _json(capsys)]
        assert got == ["PASSED: sandboxed", HUNG, "PASSED: sandboxed"]
        nb = _notebook(tmp_path / "s.ipynb", SANDBOX_CHECK, check)
        assert main(["grade", str(nb), "--json"]) == grade.EXIT_FAILED
        assert _json(capsys)[0]["message"] == "AssertionError: wrote beside the notebook"
    finally:
        listener.close()


def test_the_sandbox_hides_the_home_even_when_python_lives_in_it(tmp_path, monkeypatch):
    """The sandbox's mounts, read without bubblewrap: the home is hidden even when the venv,
    pyenv and minidist live under it (each shown again, read-only, and nothing beside them),
    a class folder inside a shown checkout is hidden again, and /run (the host's sockets:
    docker's, D-Bus's) is hidden."""
    home, klass = tmp_path / "home", tmp_path / "home" / "minidist" / "class"
    venv, checkout = home / ".venv", home / "minidist"
    for folder in (venv, klass / "alice", home / ".ssh"):
        folder.mkdir(parents=True)
    monkeypatch.setattr(grade_sandbox, "_needed", lambda: [venv, checkout])
    args = grade_sandbox.sandbox_prefix(tmp_path / "scratch", klass / "alice", [home, klass])
    mounts = [tuple(args[i : i + 3]) for i, a in enumerate(args) if a == "--ro-bind"]
    tmpfs = [i for i, a in enumerate(args) if a == "--tmpfs"]
    hidden = {args[i + 1]: i for i in tmpfs}  # the last time each is hidden
    assert str(home) in hidden and str(klass) in hidden
    assert ("--ro-bind", str(venv), str(venv)) in mounts
    assert ("--ro-bind", str(checkout), str(checkout)) in mounts
    assert args.index(str(venv)) > args.index(str(home))  # shown again after the home hid it
    assert hidden[str(klass)] > args.index(str(checkout))  # the class hidden again after that
    assert args.index(str(klass / "alice")) > hidden[str(klass)]  # the learner's own folder
    if Path("/run").is_dir():
        assert "/run" in hidden
    assert not any(str(home / ".ssh") in a for a in args)


def test_checker_time_limits_stretched(tmp_path, capsys, monkeypatch):
    """A checker's own time limit (CPU time) is stretched by --slack (3 by default) for a
    slower machine: an answer computing for 2 s against a 1 s limit passes, and fails at
    --slack 1."""
    (tmp_path / "slowcheck.py").write_text(
        "from minidist.course.failures import call_learner\n\n\n"
        "def check_slow(f):\n"
        "    call_learner(f, timeout_s=1.0)\n"
        "    print('PASSED: in time')\n"
    )
    nb = _notebook(
        tmp_path / "slow.ipynb",
        ("code", "import time\nimport minidist.course.failures"),
        ("md", "## Exercise 1: slow"),
        (
            "code",
            "from slowcheck import check_slow\n\n\n"
            "def computes_for_2_s():\n"
            "    start = time.process_time()\n"
            "    while time.process_time() - start < 2:\n"
            "        pass\n\n\n"
            "check_slow(computes_for_2_s)",
        ),
    )
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    assert main(["grade", str(nb), "--json"]) == grade.EXIT_PASSED
    assert _json(capsys)[0]["message"] == "PASSED: in time"
    assert main(["grade", str(nb), "--json", "--slack", "1"]) == grade.EXIT_FAILED
    assert "still running after 1 s" in _json(capsys)[0]["message"]


def test_csv_formulas_are_neutralised_in_every_form():
    """A formula behind a blank, a control or invisible character, or written in a form that
    Unicode folds into `=` `+` `-` `@` (full-width, small), and a DDE `|`, gets its `'` too."""
    from minidist.course.grade_class import spreadsheet_safe

    for text in (" =1+1", " \t=1", "\n=1", "\x00=1", "\u200b=1", "\u3000=1", "\u202e=1"):
        assert spreadsheet_safe(text) == "'" + text, repr(text)
    for text in ("＝1+1", "﹦1", "＋1", "－1", "＠SUM(A1)", "|cmd", "｜cmd"):
        assert spreadsheet_safe(text) == "'" + text, repr(text)
    for text in ("café", "PASSED: ＝ fine inside", "%d", "1 = 1"):
        assert spreadsheet_safe(text) == text


def test_the_table_prints_no_character_that_moves_the_cursor_or_splits_a_row():
    """A notebook name, an exercise heading or a message holding an escape sequence (which
    would erase a row and print a forged PASS over it), a carriage return, a newline or a
    bidi override is printed escaped, in the rows and in the totals."""
    from minidist.course.grade_class import totals

    forged = "\x1b[1A\x1b[2Kalice/lab.ipynb  Exercise 1  PASS"
    rows = [
        grade.Result("/x/e\x1b[2K.ipynb", "Ex\u202e 1", "FAIL", "gave 2" + forged, 0.1, "bob"),
        grade.Result("/x/a\nb\r.ipynb", "Ex\r2", "FAIL", "m", 0.1, ""),
    ]
    text = grade.format_table(rows) + "\n" + totals(rows)
    assert not any(c in text for c in "\x1b\r\u202e"), repr(text)
    assert len(grade.format_table(rows).splitlines()) == 4  # header, 2 rows, summary
    assert "bob/e\\x1b[2K.ipynb" in text and "Ex\\u202e 1" in text and "/x/a\\nb\\r.ipynb" in text


def test_outputs_never_replace_a_file_of_the_users(tmp_path, capsys, monkeypatch):
    """--csv and --feedback replace only what an earlier `grade` wrote (a CSV with its
    header, an executed copy it marked): a file of the user's at the CSV's name or at a copy's
    place (a released notebook, through a symlink too), a file where a copy needs a folder,
    the CSV at a copy's place: one line, status 2, before any notebook runs; a second run
    into the same places replaces the first's files."""
    klass = tmp_path / "class"
    for who in ("alice", "bob"):
        (klass / who).mkdir(parents=True)
        _notebook(klass / who / "lab.ipynb", CHECKER, ("code", "check_add(max)"))
    released = tmp_path / "released"
    released.mkdir()
    _notebook(released / "lab.ipynb", CHECKER, ("code", "check_add(max)"))
    home = tmp_path / "home"
    (home / "alice").mkdir(parents=True)
    (home / "notes.csv").write_text("mine\n")
    (home / "alice" / "lab.ipynb").write_text("mine")
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "alice").write_text("mine")
    (tmp_path / "notes-link.csv").symlink_to(home / "notes.csv")
    graded = []

    def fake_grade_one(path, *args):
        graded.append(path)
        return [grade.Result(str(path), "x", "FAIL", "no", 0.0)], nbformat.read(path, 4)

    monkeypatch.setattr(grade, "grade_one", fake_grade_one)
    mine = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    c, r = ["--class", str(klass)], ["--released", str(released)]
    refused = {
        (*c, "--csv", str(home / "notes.csv")): "exists and is no table an earlier grade wrote",
        (*c, "--csv", str(tmp_path / "notes-link.csv")): "exists and is no table",
        (*c, *r, "--csv", str(released / "lab.ipynb")): "exists and is no table",
        (*c, "--feedback", str(home)): "exists and is no executed copy an earlier grade wrote",
        ("--all", str(klass / "alice"), *r, "--feedback", str(released)): "is no executed copy",
        (*c, "--feedback", str(tmp_path / "files")): "is a file where the executed copy",
        (
            *c,
            "--feedback",
            str(tmp_path / "fb"),
            "--csv",
            str(tmp_path / "fb" / "bob" / "lab.ipynb"),
        ): ("is where --feedback writes the executed copy"),
    }
    (tmp_path / "fb" / "bob").mkdir(parents=True)
    for args, said in refused.items():
        assert main(["grade", *args]) == grade.EXIT_USAGE, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("minidist grade: error: "), (args, err)
        assert said in err[0], (args, err)
    assert graded == []
    assert {p: p.read_bytes() for p in mine} == mine
    argv = ["grade", *c, "--feedback", str(tmp_path / "fb"), "--csv", str(tmp_path / "g.csv")]
    assert main(argv) == grade.EXIT_FAILED
    assert main(argv) == grade.EXIT_FAILED  # its own files, replaced
    assert len(graded) == 4
    copy = nbformat.read(tmp_path / "fb" / "alice" / "lab.ipynb", 4)
    assert copy.metadata[grade.FEEDBACK_KEY] is True


def test_a_submission_linked_outside_its_folder_is_not_graded(tmp_path, capsys, monkeypatch):
    """A learner's notebook that is a symlink to a file outside their folder (the
    instructor's solutions, another student's answer) is an ERROR row, not graded as theirs;
    a link inside the folder, and a notebook named on the command line, are graded."""
    solutions = _notebook(tmp_path / "solution.ipynb", CHECKER, ("code", "check_add(max)"))
    klass = tmp_path / "class"
    for who in ("alice", "bob", "carol"):
        (klass / who).mkdir(parents=True)
    _notebook(klass / "alice" / "lab.ipynb", CHECKER, ("code", "check_add(max)"))
    (klass / "bob" / "lab.ipynb").symlink_to(solutions)
    (klass / "carol" / "lab.ipynb").symlink_to(klass / "alice" / "lab.ipynb")
    (klass / "carol" / "mine.ipynb").symlink_to("lab.ipynb")  # resolves outside: alice's
    (klass / "alice" / "again.ipynb").symlink_to("lab.ipynb")  # inside alice's folder
    graded = []

    def fake_grade_one(path, *args):
        graded.append(path)
        return [grade.Result(str(path), "x", "PASS", "PASSED", 0.0, args[-1])], None

    monkeypatch.setattr(grade, "grade_one", fake_grade_one)
    assert main(["grade", "--class", str(klass), "--json"]) == grade.EXIT_FAILED
    rows = {(r["student"], Path(r["notebook"]).name): r for r in _json(capsys)}
    assert sorted(graded) == [klass / "alice" / "again.ipynb", klass / "alice" / "lab.ipynb"]
    for key in (("bob", "lab.ipynb"), ("carol", "lab.ipynb"), ("carol", "mine.ipynb")):
        assert rows[key]["status"] == "ERROR", rows[key]
        assert "only the submission's own files are graded" in rows[key]["message"]
    assert main(["grade", "--all", str(klass / "bob"), "--json"]) == grade.EXIT_FAILED
    assert _json(capsys)[0]["status"] == "ERROR"
    assert main(["grade", str(klass / "bob" / "lab.ipynb"), "--json"]) == grade.EXIT_PASSED


def test_a_cell_printing_in_a_loop_does_not_fill_the_grader_s_memory(tmp_path, capsys):
    """A cell that prints as fast as it can until it is interrupted: ipykernel sends what it
    printed in one message per flush, hundreds of MB each, which the grader held whole (3 GB
    after 8 s: with the default 120 s, out of memory and the class lost). The grader's memory
    stays bounded, the next exercise is graded."""
    import threading

    nb = _notebook(
        tmp_path / "flood.ipynb",
        CHECKER,
        ("code", "while True:\n    print('x' * 10000)"),
        ("md", "## Exercise 1: after it"),
        ("code", "check_add(lambda a, b: a + b)"),
    )
    page = os.sysconf("SC_PAGE_SIZE")

    def rss() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * page

    start, peak, done = rss(), [0], threading.Event()

    def watch():
        while not done.wait(0.05):
            peak[0] = max(peak[0], rss())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        rows = grade.grade_notebook(nb, timeout_s=5, released=None)
    finally:
        done.set()
        watcher.join()
    assert [(r.exercise, r.status) for r in rows] == [("Exercise 1: after it", "PASS")]
    grown = (peak[0] - start) >> 20
    assert grown < 300, f"the grader grew {grown} MB"  # messages of 32 MB at most
