"""The planted-bug catalogue stays planted: each bug's text occurs exactly once in its file (a
change elsewhere that moved the text would silently drop the bug from `sweep.py`)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "mutants"))
import catalogue  # noqa: E402


@pytest.mark.parametrize("package, path, text, replacement, why", catalogue.MUTANTS)
def test_each_planted_bug_finds_its_line(package, path, text, replacement, why):
    source = (ROOT / "minidist" / path).read_text()
    assert source.count(text) == 1, f"{package}: {why!r}: its text occurs {source.count(text)}x"
    assert replacement != text
