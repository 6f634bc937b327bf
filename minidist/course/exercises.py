"""Generate exercises/ from solutions/: every solution region becomes a stub.

In a solution notebook, the answer to an exercise sits between two marker lines:

    ### BEGIN SOLUTION
    ...the answer...
    ### END SOLUTION

`generate` writes a copy of each notebook to exercises/ with every such region replaced by
`raise NotImplementedError(...)` at the region's indentation and all outputs cleared (the
learner runs the cells). `stale` says which exercise notebooks differ from what `generate`
would write, so a test can fail when someone edits a solution and forgets to regenerate.
Run it with `python -m minidist exercises`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = 'raise NotImplementedError("exercise: replace this line with your code")'


def stub_source(source: str) -> str:
    """Replace each solution region of a cell's source by a NotImplementedError stub."""
    out: list[str] = []
    inside = False
    for line in source.splitlines(keepends=True):
        stripped = line.strip()
        if stripped == BEGIN:
            if inside:
                raise ValueError(f"nested {BEGIN!r} in cell:\n{source}")
            inside = True
            indent = re.match(r"\s*", line).group(0)
            out.append(f"{indent}{STUB}\n")
        elif stripped == END:
            if not inside:
                raise ValueError(f"{END!r} without {BEGIN!r} in cell:\n{source}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{BEGIN!r} without {END!r} in cell:\n{source}")
    stubbed = "".join(out)
    # A region that ended the cell must not leave a newline the cell did not have.
    return stubbed if source.endswith("\n") else stubbed.rstrip("\n")


def _cell_source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def exercise_notebook(solution: dict) -> dict:
    """The exercise version of a solution notebook (a parsed .ipynb dict)."""
    nb = json.loads(json.dumps(solution))
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        cell["source"] = stub_source(_cell_source(cell))
        cell["outputs"] = []
        cell["execution_count"] = None
    return nb


def _dumps(nb: dict) -> str:
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def _pairs(solutions_dir: Path, exercises_dir: Path):
    for path in sorted(Path(solutions_dir).glob("*.ipynb")):
        yield path, Path(exercises_dir) / path.name


def count_regions(notebook: dict) -> int:
    return sum(_cell_source(c).count(BEGIN) for c in notebook["cells"] if c["cell_type"] == "code")


def generate(solutions_dir: Path | str, exercises_dir: Path | str) -> list[Path]:
    """Write exercises/ from solutions/; returns the paths written."""
    Path(exercises_dir).mkdir(parents=True, exist_ok=True)
    written = []
    for src, dst in _pairs(Path(solutions_dir), Path(exercises_dir)):
        dst.write_text(_dumps(exercise_notebook(json.loads(src.read_text()))))
        written.append(dst)
    return written


def stale(solutions_dir: Path | str, exercises_dir: Path | str) -> list[Path]:
    """Exercise notebooks that are missing or differ from what `generate` would write."""
    out = []
    for src, dst in _pairs(Path(solutions_dir), Path(exercises_dir)):
        expected = _dumps(exercise_notebook(json.loads(src.read_text())))
        if not dst.exists() or dst.read_text() != expected:
            out.append(dst)
    return out
