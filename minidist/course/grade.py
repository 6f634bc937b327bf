"""Grade a learner's exercise notebooks: `python -m minidist grade NOTEBOOK... | --all DIR`.

Each notebook runs headless in a fresh kernel (nbclient), every code cell in order, as a
learner's "Run all" would, except that an error does not stop the run: a wrong answer in
exercise 1 still lets exercise 2 be graded. An exercise is its check cell, the code cell
that calls a `check_*` function (the notebook's "## Exercise N: ..." heading above it gives
its name). It PASSES when that cell ran without an error, and FAILS with the checker's
message (`CheckFailed`, or the learner's own exception, such as the stub's
`NotImplementedError`) otherwise.

Two things would stop a plain "Run all" and do not stop the grader:

- a cell that runs past `timeout_s` is interrupted (SIGINT, as the notebook's stop button)
  and reported; when the kernel does not answer the interrupt, the notebook's remaining
  exercises fail with that reason and grading moves on to the next notebook;
- a kernel that dies (a segfault, `os._exit`, out of memory) is reported for every
  exercise it did not reach, and the next notebook runs in a new kernel.
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

CHECK_CALL = re.compile(r"^\s*check_\w+\(", re.MULTILINE)
EXERCISE_HEADING = re.compile(r"^#+\s*(Exercise\b.*)$", re.MULTILINE)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
PING_TIMEOUT_S = 10


@dataclass
class Result:
    """One exercise of one notebook: passed or not, what the checker said, how long it took."""

    notebook: str
    exercise: str
    passed: bool
    message: str
    seconds: float


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def find_exercises(nb) -> list[tuple[int, str]]:
    """[(index of the check cell, the exercise's name)] in notebook order."""
    out, heading = [], None
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "markdown":
            found = EXERCISE_HEADING.findall(_source(cell))
            heading = found[-1].strip() if found else heading
        elif cell["cell_type"] == "code" and CHECK_CALL.search(_source(cell)):
            out.append((index, heading or f"check cell {index}"))
            heading = None
    return out


def _verdict(cell) -> tuple[bool, str]:
    """(passed, message) from a check cell's outputs."""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            return False, ANSI.sub("", f"{out['ename']}: {out['evalue']}").strip()
    text = "".join(
        _source({"source": o.get("text", "")})
        for o in cell.get("outputs", [])
        if o.get("output_type") == "stream"
    )
    said = [line for line in text.splitlines() if line.strip()]
    return True, said[-1] if said else "the check cell ran without an error"


def grade_notebook(path: Path | str, timeout_s: float = 120.0) -> list[Result]:
    """Run one notebook's cells in order in a fresh kernel and grade each exercise."""
    import nbformat

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    exercises = find_exercises(nb)
    if not exercises:
        return []
    names = dict(exercises)
    client = _client(nb, path, timeout_s)
    results: dict[int, Result] = {}
    abandoned: str | None = None
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells[: exercises[-1][0] + 1]):
            if cell.cell_type != "code":
                continue
            start = time.perf_counter()
            abandoned = _run(client, cell, index, timeout_s)
            seconds = time.perf_counter() - start
            if index in names:
                if abandoned:
                    passed, message = False, abandoned
                elif client.timed_out:
                    passed, message = (
                        False,
                        (
                            f"the cell ran past the {timeout_s:g} s per-cell timeout and was "
                            "interrupted (a loop that never ends, or a rank waiting for a message "
                            "no rank sends?)"
                        ),
                    )
                else:
                    passed, message = _verdict(cell)
                results[index] = Result(str(path), names[index], passed, message, seconds)
            if abandoned:
                break
    return [
        results.get(index) or Result(str(path), name, False, f"not run: {abandoned}", 0.0)
        for index, name in exercises
    ]


def _client(nb, path: Path, timeout_s: float):
    """An nbclient that keeps going after errors and interrupts a cell at the timeout."""
    from nbclient import NotebookClient

    class Client(NotebookClient):
        timed_out = False

        async def _async_handle_timeout(self, timeout, cell=None):
            self.timed_out = True
            return await super()._async_handle_timeout(timeout, cell)

    return Client(
        nb,
        timeout=timeout_s,
        allow_errors=True,
        interrupt_on_timeout=True,
        error_on_timeout={"ename": "CellTimeout", "evalue": "interrupted", "traceback": []},
        resources={"metadata": {"path": str(path.parent.resolve())}},
    )


def _run(client, cell, index: int, timeout_s: float) -> str | None:
    """Run one cell; returns why the notebook cannot go on (None when it can)."""
    from nbclient.exceptions import DeadKernelError

    client.timed_out = False
    try:
        client.execute_cell(cell, index)
    except DeadKernelError:
        return f"the kernel died while running cell {index}"
    if client.timed_out and not _kernel_answers(client):
        client.shutdown_kernel = "immediate"  # a graceful shutdown would wait for it
        return f"cell {index} hung past {timeout_s:g} s and ignored the interrupt"
    return None


def _kernel_answers(client) -> bool:
    """After an interrupted cell: does the kernel run a trivial cell within a few seconds?"""
    import nbformat
    from nbclient.exceptions import DeadKernelError

    ping = nbformat.v4.new_code_cell("pass")
    timeout, client.timeout = client.timeout, PING_TIMEOUT_S
    client.nb.cells.append(ping)
    client.timed_out = False
    try:
        client.execute_cell(ping, len(client.nb.cells) - 1)
    except DeadKernelError:
        return False
    finally:
        client.timeout = timeout
        client.nb.cells.pop()
    answered, client.timed_out = not client.timed_out, True
    return answered


def format_table(results: list[Result]) -> str:
    """The table `grade` prints: one row per exercise, then a one-line summary."""
    rows = [("notebook", "exercise", "result", "time", "message")]
    for r in results:
        verdict = "PASS" if r.passed else "FAIL"
        rows.append((r.notebook, r.exercise, verdict, f"{r.seconds:.1f} s", r.message))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[4] for row in rows]
    failed = sum(not r.passed for r in results)
    total = sum(r.seconds for r in results)
    lines.append(
        f"{len(results)} exercises: {len(results) - failed} passed, {failed} failed "
        f"({total:.1f} s in check cells)"
    )
    return "\n".join(line.rstrip() for line in lines)


def run_grade(paths: list[str], all_dir: str | None, timeout_s: float, as_json: bool) -> int:
    """The CLI: grade, print the table (or JSON); exit code = exercises failed (max 255)."""
    if timeout_s <= 0:
        raise ValueError(f"--timeout={timeout_s:g} must be > 0 (seconds per cell)")
    notebooks = [Path(p) for p in paths]
    if all_dir is not None:
        if not Path(all_dir).is_dir():
            raise ValueError(f"--all {all_dir!r} must be a folder of .ipynb notebooks")
        notebooks += sorted(Path(all_dir).glob("*.ipynb"))
    missing = [str(p) for p in notebooks if not p.is_file()]
    if missing or not notebooks:
        raise ValueError(f"notebooks to grade must exist; missing: {missing or 'none given'}")
    results: list[Result] = []
    for path in notebooks:
        print(f"grading {path} ...", file=sys.stderr, flush=True)
        results += grade_notebook(path, timeout_s)
    if as_json:
        print(json.dumps([asdict(r) for r in results], indent=1))
    else:
        print(format_table(results))
    return min(sum(not r.passed for r in results), 255)
