"""`python -m minidist grade`: stubs fail, solutions pass, hangs and crashed kernels are reported.

The shipped notebooks are graded for one lesson (00, the quickest); `make` users grade the
whole course with `python -m minidist grade --all solutions` (figures in the README). The
timeout and crash cases run on small synthetic notebooks.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from minidist.__main__ import main
from minidist.course import grade
from minidist.course.exercises import STUB

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


def test_timeouts_crashes_and_the_cli(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(grade, "PING_TIMEOUT_S", 2)
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
        ("md", "## Exercise 1: the kernel dies"),
        ("code", "check_add(lambda a, b: os._exit(1))"),
        ("md", "## Exercise 2: never reached"),
        ("code", "check_add(lambda a, b: a + b)"),
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
    argv = ["grade", str(first), str(crash), str(deaf), str(after), "--timeout", "3", "--json"]
    failed = main(argv)
    got = [(r["notebook"], r["exercise"], r["passed"], r["message"]) for r in _json(capsys)]
    assert failed == 6
    n = [str(p) for p in (first, crash, deaf, after)]
    assert got[:4] == [
        (n[0], "Exercise 1: right", True, "PASSED: add(1, 2) == 3"),
        (n[0], "Exercise 2: wrong", False, "AssertionError: add(1, 2) gave 2, expected 3"),
        (n[0], "Exercise 3: hangs, then is interrupted", False, HUNG),
        (n[0], "Exercise 4: the kernel still answers", True, "PASSED: add(1, 2) == 3"),
    ]  # fmt: skip
    assert got[4:6] == [
        (n[1], "Exercise 1: the kernel dies", False, "the kernel died while running cell 2"),
        (n[1], "Exercise 2: never reached", False,
         "not run: the kernel died while running cell 2"),
    ]  # fmt: skip
    reason = "cell 2 hung past 3 s and ignored the interrupt"
    assert got[6:8] == [
        (n[2], "Exercise 1: ignores the interrupt", False, reason),
        (n[2], "Exercise 2: never reached", False, f"not run: {reason}"),
    ]
    assert got[8] == (n[3], "check cell 1", True, "PASSED: add(1, 2) == 3")


HUNG = (
    "the cell ran past the 3 s per-cell timeout and was interrupted (a loop that never "
    "ends, or a rank waiting for a message no rank sends?)"
)


def _json(capsys) -> list[dict]:
    return json.loads(capsys.readouterr().out)


def test_table_and_bad_arguments(tmp_path, capsys):
    nb = _notebook(tmp_path / "x.ipynb", CHECKER, ("code", "check_add(lambda a, b: 0)"))
    assert main(["grade", "--all", str(tmp_path)]) == 1
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["notebook", "exercise", "result", "time", "message"]
    assert table[1].startswith(str(nb)) and " FAIL " in table[1]
    assert table[1].endswith("AssertionError: add(1, 2) gave 0, expected 3")
    assert table[-1].startswith("1 exercises: 0 passed, 1 failed")
    with pytest.raises(ValueError, match="--timeout=0 must be > 0"):
        main(["grade", str(nb), "--timeout", "0"])
    with pytest.raises(ValueError, match="must exist; missing: .*nope.ipynb"):
        main(["grade", str(tmp_path / "nope.ipynb")])
    with pytest.raises(ValueError, match="must be a folder"):
        main(["grade", "--all", str(nb)])
