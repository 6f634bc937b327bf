"""The checkout's folder name is nobody's business (issue 36): `git clone` of this repository
makes a folder named `minidist`, and code that found "the library's files" by a folder of
that name took the learner's files, the tests and a venv inside the checkout for minidist's
own. minidist finds its files by where its package is, never by a name; the tests that
print a call's place run again here in a copy named `minidist`, in a deep path with spaces."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from minidist.planner.check import _shared
from minidist.runtime import board

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minidist"


def test_the_library_is_found_by_its_place_not_by_a_folder_name(tmp_path):
    checkout = tmp_path / "minidist"  # what `git clone` makes
    for learner in (
        checkout / "tests" / "test_runtime.py",
        checkout / ".venv" / "lib" / "python3.11" / "site-packages" / "torch" / "x.py",
        tmp_path / "minidist" / "minidist" / "comm.py",  # another checkout's package
        tmp_path / "work" / "minidist" / "my_solution.py",
    ):
        assert board._short(str(learner)) == learner.name, learner
        assert not _shared._in_package(str(learner)), learner
    own = PACKAGE / "runtime" / "board.py"
    assert board._short(str(own)) == os.path.join("minidist", "runtime", "board.py")
    assert _shared._in_package(str(own))


def test_a_copy_in_a_folder_named_minidist_passes_the_tests_that_name_places(tmp_path):
    copy = tmp_path / "with space" / "a" / "deep" / "path" / "minidist"
    ignore = shutil.ignore_patterns("__pycache__", "mutants", "*.pyc")
    for name in ("minidist", "tests"):
        shutil.copytree(ROOT / name, copy / name, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", copy)
    tests = ["tests/test_runtime.py", "-k", "names_the_ranks_inside_a_collective"]
    env = {**os.environ, "PYTHONPATH": str(copy)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:nbval", "-q", "-p", "no:cacheprovider", *tests],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
