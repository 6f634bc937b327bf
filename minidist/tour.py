"""`python -m minidist tour`: every technique on a local CPU world, checked and measured.

Each row runs one technique on a world of real processes and the same model in one process,
and reports: does it match the reference (and the largest difference), model-state memory
per rank next to its formula, bytes each rank sent per step next to the theory, wall time.
Rows may also save figures into the output folder. The rows live in the lesson packages
(`minidist/<lesson>/lesson.py`) and are found through `minidist.registry`.
"""

from __future__ import annotations

import time
from pathlib import Path

from .registry import TourRow, tour_rows


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.3f} MiB"


def format_table(rows: list[TourRow]) -> str:
    width = max([len("technique"), *(len(r.technique) for r in rows)]) + 2
    head = (
        f"{'technique':<{width}}{'matches reference':<24}{'memory/rank (theory)':<28}"
        f"{'sent/rank/step (theory)':<30}{'time':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        match = f"{'yes' if r.matches else 'NO'} ({r.max_abs_diff:.1e})"
        mem = f"{_mib(r.memory_per_rank)} ({_mib(r.memory_theory)})"
        sent = f"{_mib(r.bytes_per_rank)} ({_mib(r.bytes_theory)})"
        lines.append(f"{r.technique:<{width}}{match:<24}{mem:<28}{sent:<30}{r.seconds:>6.1f}s")
    return "\n".join(lines)


def run_tour(world_size: int, out_dir: Path, only: list[str] | None = None) -> int:
    from tqdm.auto import tqdm

    registered = tour_rows()
    unknown = set(only or []) - set(registered)
    if unknown:
        raise SystemExit(f"tour: unknown rows {sorted(unknown)}; choose from {list(registered)}")
    names = [n for n in registered if not only or n in only]
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    progress = tqdm(names, desc="tour", unit="technique")
    for name in progress:
        progress.set_postfix_str(name)
        t0 = time.perf_counter()
        row = registered[name](world_size, out_dir)
        row.seconds = time.perf_counter() - t0
        rows.append(row)
    print(f"\nminidist tour on a CPU world of {world_size} ranks (gloo)\n")
    print(format_table(rows))
    print(f"\nplots written to {out_dir.resolve()}/")
    return 0 if all(r.matches for r in rows) else 1
