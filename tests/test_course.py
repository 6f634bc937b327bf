"""The course machinery: exercises are generated, fresh, and every stub says so when run."""

import json
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from minidist.course.exercises import BEGIN, END, STUB, count_regions, stale, stub_source

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))


def test_stub_source_replaces_each_region_at_its_indentation():
    src = f"def f(x):\n    {BEGIN}\n    return 2 * x\n    {END}\n\nprint(1)\n"
    assert stub_source(src) == f"def f(x):\n    {STUB}\n\nprint(1)\n"
    assert stub_source("a = 1\n") == "a = 1\n"


@pytest.mark.parametrize("bad", [f"{BEGIN}\nx\n", f"x\n{END}\n", f"{BEGIN}\n{BEGIN}\n{END}\n"])
def test_unbalanced_markers_are_reported(bad):
    with pytest.raises(ValueError, match="SOLUTION"):
        stub_source(bad)


def test_exercises_are_not_stale():
    out = stale(ROOT / "solutions", ROOT / "exercises")
    assert not out, f"regenerate with `python -m minidist exercises`: {out}"


def test_every_solution_has_exercises_with_checks():
    solutions = sorted((ROOT / "solutions").glob("*.ipynb"))
    assert len(solutions) >= 2 and len(EXERCISES) == len(solutions)
    for path in solutions:
        nb = json.loads(path.read_text())
        assert count_regions(nb) >= 2, f"{path.name}: fewer than two exercises"
        assert not any(STUB in "".join(c["source"]) for c in nb["cells"]), path.name


@pytest.fixture(scope="module")
def executed_exercises(request) -> dict:
    """Every exercise notebook this session tests, run top to bottom in one kernel, its
    namespace reset before each notebook (`%reset -f`: a name a notebook forgets to define
    or import still fails; the modules stay imported, so a notebook costs its cells, not a
    kernel's start and torch's import): path -> the executed notebook, or what its run
    raised."""
    paths = [
        item.callspec.params["path"]
        for item in request.session.items
        # (a notebook's cell, collected in the same session, has no `originalname`)
        if getattr(item, "originalname", "") == "test_every_exercise_check_raises_not_implemented"
    ]
    out: dict = {}
    if not paths:
        return out
    notebooks = {p: nbformat.read(p, as_version=4) for p in paths}
    client = NotebookClient(
        notebooks[paths[0]], timeout=600, kernel_name="python3", allow_errors=True
    )
    reset = nbformat.v4.new_code_cell("%reset -f")
    with client.setup_kernel():
        for path, nb in notebooks.items():
            client.nb = nb  # the client keeps each cell's outputs by its index in `nb`
            try:
                client.execute_cell(reset, 0)
                for i, cell in enumerate(nb.cells):
                    client.execute_cell(cell, i)
                out[path] = nb
            except Exception as exc:  # a kernel that died: this notebook's test says so
                out[path] = exc
    return out


@pytest.mark.parametrize("path", EXERCISES, ids=[p.name for p in EXERCISES])
def test_every_exercise_check_raises_not_implemented(path, executed_exercises):
    nb = executed_exercises[path]
    if isinstance(nb, BaseException):
        raise nb
    errors = {}
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                errors[i] = out["ename"]
    assert errors, f"{path.name}: no exercise stub raised"
    assert set(errors.values()) == {"NotImplementedError"}, errors
    calls_checker = re.compile(r"\bcheck_\w+\(")
    code = [(i, c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    check_cells = [i for i, src in code if calls_checker.search(src)]
    assert check_cells and all(i in errors for i in check_cells), (check_cells, errors)


TEXT_FILES = sorted(
    [*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("solutions/*.ipynb"), ROOT / "README.md"]
)


@pytest.mark.parametrize("path", TEXT_FILES, ids=[p.name for p in TEXT_FILES])
def test_text_names_only_lessons_that_exist(path):
    """Every "notebook NN" / "lesson NN" (or a range "lessons NN-MM") names a notebook here."""
    text = path.read_text()
    named = set()
    for first, last in re.findall(r"(?i)(?:notebook|lesson)s? (\d{2})(?:\s*[-–]\s*(\d{2}))?", text):
        named.update(f"{n:02d}" for n in range(int(first), int(last or first) + 1))
    existing = {p.name[:2] for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert named <= existing, f"{path.name} names lessons {sorted(named - existing)}"


NOTEBOOKS = sorted(
    [
        *ROOT.glob("notebooks/*.ipynb"),
        *ROOT.glob("solutions/*.ipynb"),
        *ROOT.glob("exercises/*.ipynb"),
    ]
)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[f"{p.parent.name}/{p.name}" for p in NOTEBOOKS])
def test_a_notebook_removes_the_temporary_folders_it_makes(path):
    """A folder a notebook makes with `mkdtemp` is removed by a later cell (`rmtree`); a
    `TemporaryDirectory` block removes its own. Lessons 13, 18 and 19 left theirs in the
    learner's /tmp (and one each per `make test`: 63 folders on this machine over a day)."""
    cells = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    for i, source in enumerate(cells):
        for name in re.findall(r"^(\w+)\s*=.*\bmkdtemp\(", source, flags=re.M):
            later = "\n".join(cells[i:])
            assert re.search(rf"\brmtree\(\s*{name}\b", later), f"{path.name}: {name} is left"
        # a mkdtemp() whose folder is not kept in a name cannot be removed
        assert not re.search(r"^(?!\s*\w+\s*=).*\bmkdtemp\(", source, flags=re.M), path.name
