"""A class at once (`grade --class DIR`): each subfolder of DIR is a student, each of their
`*.ipynb` a notebook to grade; the rows go to a CSV (student, lesson, exercise, status,
message, seconds: the csv module quotes multi-line messages, so a row stays a row; a field
that a spreadsheet would run as a formula is neutralised, OWASP's rule), with
totals per student and per exercise; notebooks run `-j N` at a time, each in its own
kernel."""

from __future__ import annotations

import csv
import sys
import unicodedata
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .grade_run import Result

CSV_COLUMNS = ("student", "lesson", "exercise", "status", "message", "seconds")


def students(class_dir: Path) -> list[tuple[str, list[Path]]]:
    """[(student, their notebooks)] for every non-hidden subfolder, by name."""
    out = []
    for folder in sorted(p for p in class_dir.iterdir() if p.is_dir()):
        if not folder.name.startswith("."):
            out.append((folder.name, sorted(folder.glob("*.ipynb"))))
    return out


def grade_all(
    jobs: list[tuple[str, Path]], grade: Callable[[str, Path], list[Result]], workers: int
) -> list[Result]:
    """Every (student, notebook) graded, `workers` at a time; rows in the jobs' order."""

    def one(job: tuple[str, Path]) -> list[Result]:
        student, path = job
        who = f"{shown(student)}: " if student else ""
        print(f"grading {who}{visible(str(path))} ...", file=sys.stderr, flush=True)
        return grade(student, path)

    if workers <= 1:
        return [r for job in jobs for r in one(job)]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return [r for rows in pool.map(one, jobs) for r in rows]


def write_csv(results: list[Result], path: Path) -> None:
    """The rows as CSV, every text field neutralised (`spreadsheet_safe`)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(CSV_COLUMNS)
        for r in results:
            lesson = Path(r.notebook).stem if r.notebook else ""
            texts = (r.student, lesson, r.exercise, r.status, r.message)
            out.writerow((*map(spreadsheet_safe, texts), f"{r.seconds:.2f}"))


FORMULA_START = ("=", "+", "-", "@", "|")


def spreadsheet_safe(text: str) -> str:
    """OWASP's rule against CSV injection, made to hold for every way of writing it: a field
    gets a leading `'`, so a spreadsheet shows it as text instead of running it as a formula
    (a learner's message `=HYPERLINK(...)` or `=cmd|...`), when it starts with a blank, a
    control or an invisible character (a tab, a carriage return, a space or a zero-width
    space, which some spreadsheets skip before a formula), or when it starts with `=`,
    `+`, `-`, `@` or `|` in any form that Unicode's compatibility normalisation (NFKC)
    folds into one (a full-width `＝`, a small `﹦`)."""
    if not text:
        return text
    first = text[0]
    hidden = first.isspace() or unicodedata.category(first) in ("Cc", "Cf", "Zl", "Zp", "Zs")
    if hidden or unicodedata.normalize("NFKC", first).startswith(FORMULA_START):
        return f"'{text}"
    return text


def shown(name: str) -> str:
    """A student's folder name as the table prints it: as it is when printable and in NFC
    form, else escaped (`ascii`), so that a newline cannot split a row and two names that
    differ only in their Unicode normalisation do not print the same."""
    plain = name.isprintable() and unicodedata.normalize("NFC", name) == name
    return name if plain else ascii(name)


def visible(text: str) -> str:
    """`text` for a line of the terminal: each character that is not printable (an escape
    sequence's ESC that would move the cursor over another row, a carriage return, a bidi
    override that would reorder the line, a newline) written as its escape (`\\x1b`), every
    other character as it is."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def totals(results: list[Result]) -> str:
    """PASS counts per student and per exercise (lesson / exercise), as two small tables."""
    by_student: dict[str, list[Result]] = defaultdict(list)
    by_exercise: dict[str, list[Result]] = defaultdict(list)
    for r in results:
        by_student[r.student].append(r)
        if r.notebook:
            by_exercise[visible(f"{Path(r.notebook).stem} / {r.exercise}")].append(r)
    lines = ["per student:"]
    lines += [f"  {shown(who)}  {_count(rows)}" for who, rows in by_student.items()]
    lines.append("per exercise:")
    lines += [f"  {name}  {_count(rows)}" for name, rows in sorted(by_exercise.items())]
    return "\n".join(lines)


def _count(rows: list[Result]) -> str:
    passed = sum(r.status == "PASS" for r in rows)
    errors = sum(r.status == "ERROR" for r in rows)
    return f"{passed}/{len(rows)} PASS" + (f", {errors} ERROR" if errors else "")
