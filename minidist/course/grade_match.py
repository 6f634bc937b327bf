"""Which exercises a submitted notebook answers: read it (a ValueError, not a crash, for a
file that is not a notebook), find its check cells, and match it to the released exercise
notebook it shares the most exercises with (headings, checkers called), then each released
exercise to the learner's check cell (`grade_run` runs them).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

CHECK_CALL = re.compile(r"^\s*(check_\w+)\(", re.MULTILINE)
EXERCISE_HEADING = re.compile(r"^#+\s*(Exercise\b.*)$", re.MULTILINE)


@dataclass
class Exercise:
    name: str
    source: str  # the released check cell
    checks: list[str] = field(default_factory=list)


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def find_exercises(nb) -> list[tuple[int, Exercise]]:
    """[(index of the check cell, its exercise)] in notebook order."""
    out, heading = [], None
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "markdown":
            found = EXERCISE_HEADING.findall(_source(cell))
            heading = found[-1].strip() if found else heading
        elif cell["cell_type"] == "code" and CHECK_CALL.search(_source(cell)):
            src = _source(cell)
            name = heading or f"check cell {index}"
            out.append((index, Exercise(name, src, CHECK_CALL.findall(src))))
            heading = None
    return out


def released_twin(path: Path, released: Path | None, nb=None) -> Path | None:
    """The released exercise notebook this one answers, decided by its exercises (their
    headings and the checkers its cells call) before its file name: a renamed notebook is
    still graded against the released check cells, never by its own. The released notebook
    sharing the most exercises (ties: the one of the same name); the one of the same name
    when none shares any; None for a released notebook itself, or no released folder."""
    if released is None:
        return None
    candidates = _released_keys(str(released.resolve()))
    if any(candidate.resolve() == path.resolve() for candidate, _ in candidates):
        return None
    mine = _exercise_keys(nb) if nb is not None else set()
    scored = [
        (len(mine & keys), candidate.name == path.name, candidate) for candidate, keys in candidates
    ]
    shared, same_name, best = max(scored, key=lambda s: s[:2], default=(0, False, None))
    return best if shared or same_name else None


def _exercise_keys(nb) -> set[str]:
    """What identifies a notebook's exercises: their headings and the checkers called."""
    keys = set()
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            keys |= {f"heading:{h.strip()}" for h in EXERCISE_HEADING.findall(_source(cell))}
        elif cell["cell_type"] == "code":
            keys |= {f"check:{c}" for c in CHECK_CALL.findall(_source(cell))}
    return keys


@functools.lru_cache(maxsize=8)
def _released_keys(released: str) -> tuple[tuple[Path, frozenset[str]], ...]:
    out = []
    for candidate in sorted(Path(released).glob("*.ipynb")):
        try:
            out.append((candidate, frozenset(_exercise_keys(read_notebook(candidate)))))
        except ValueError:
            continue
    return tuple(out)


def _match(nb, exercises: list[Exercise]) -> list[int | None]:
    """For each released exercise, the learner's check cell (None: gone): the first cell
    after the previous exercise's that is the released check cell unchanged, else the first
    that calls its checker in code (a mention in a comment, as in an answer cell's "then
    run check_add(add)", is not a call)."""
    found, start = [], 0
    for ex in exercises:
        calls = re.compile(r"\b(" + "|".join(map(re.escape, ex.checks)) + r")\(")
        code = [i for i in range(start, len(nb.cells)) if nb.cells[i].cell_type == "code"]
        same = (i for i in code if nb.cells[i].source.strip() == ex.source.strip())
        calling = (i for i in code if _calls(nb.cells[i].source, ex.checks, calls))
        index = next(same, None)
        index = next(calling, None) if index is None else index
        found.append(index)
        start = index + 1 if index is not None else start
    return found


def _calls(source: str, checks: list[str], pattern: re.Pattern) -> bool:
    """Whether `source` calls one of `checks` in its code (a name then `(`; comments and
    strings do not count); text that is not Python is searched as it is."""
    import io
    import tokenize

    try:
        tokens = [
            t
            for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)
        ]
    except (tokenize.TokenError, SyntaxError):
        return bool(pattern.search(source))
    return any(
        a.type == tokenize.NAME and a.string in checks and b.string == "("
        for a, b in zip(tokens, tokens[1:])
    )


def read_notebook(path: Path):
    """The notebook, or a ValueError saying why the file is not one."""
    import json

    import nbformat

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read it ({exc})") from None
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not a notebook: not JSON ({exc})") from None
    try:
        nb = nbformat.reads(text, as_version=4)
        nbformat.validate(nb)
    except Exception as exc:  # nbformat's reader and validation errors
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"not a valid notebook ({first[:200]})") from None
    return nb
