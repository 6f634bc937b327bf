"""How the harnesses find the lessons: tour rows and benches register themselves here.

Each lesson package may hold a `lesson` module that decorates its tour rows with
`@tour_row(name, lesson=NN)` and its benches with `@bench(name)`. `python -m minidist tour`
and `bench` call `load_lessons()`, which imports `minidist.<package>.lesson` for every
package that has one, so adding a lesson adds a package and edits no harness.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass
class TourRow:
    """What one technique showed: equal to the reference? memory and bytes vs theory."""

    technique: str
    matches: bool
    max_abs_diff: float
    memory_per_rank: int | None  # bytes measured
    memory_theory: int | None
    bytes_per_rank: float | None  # bytes sent per rank per step (ring model), measured
    bytes_theory: float | None
    seconds: float = 0.0


TourFn = Callable[[int, Path], TourRow]
BenchFn = Callable[[int, int, int], dict[str, float]]
_TOUR_ROWS: dict[str, tuple[int, TourFn]] = {}
_BENCHES: dict[str, BenchFn] = {}


def tour_row(name: str, lesson: int):
    """Register `fn(world_size, out_dir) -> TourRow` as the tour row `name` of lesson `lesson`."""

    def register(fn: TourFn) -> TourFn:
        _TOUR_ROWS[name] = (lesson, fn)
        return fn

    return register


def bench(name: str):
    """Register `fn(world_size, rounds, steps) -> {name: value}` as `minidist bench NAME`."""

    def register(fn: BenchFn) -> BenchFn:
        _BENCHES[name] = fn
        return fn

    return register


def load_lessons() -> list[str]:
    """Import the `lesson` module of every lesson package; returns the packages found."""
    root = Path(__file__).parent
    found = []
    for info in sorted(pkgutil.iter_modules([str(root)]), key=lambda i: i.name):
        if info.ispkg and importlib.util.find_spec(f"minidist.{info.name}.lesson"):
            importlib.import_module(f"minidist.{info.name}.lesson")
            found.append(info.name)
    return found


def tour_rows() -> dict[str, TourFn]:
    """Every registered tour row, in lesson order (registration order within a lesson)."""
    load_lessons()
    ordered = sorted(_TOUR_ROWS.items(), key=lambda item: item[1][0])
    return {name: fn for name, (_, fn) in ordered}


def benches() -> dict[str, BenchFn]:
    load_lessons()
    return dict(_BENCHES)
