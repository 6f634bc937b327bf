"""Lesson 13's notebook pictures and tables beside `plots.plot_sweep`: a plan next to a run,
by kind, and plain-text tables (the notebook prints its comparisons with them)."""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure


def plot_plan_vs_measured(
    rows: dict[str, tuple[float, float]], title: str, unit: str = "bytes"
) -> Figure:
    """One pair of bars per row: what the plan predicted beside what the run measured."""
    fig = Figure(figsize=(max(5.0, 1.1 * len(rows) + 2), 3.6))
    ax = fig.subplots()
    names = list(rows)
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [rows[n][0] for n in names], 0.4, label="planned")
    ax.bar([x + 0.2 for x in xs], [rows[n][1] for n in names], 0.4, label="measured")
    ax.set_xticks(list(xs), names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(unit)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return fig


def text_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell; numbers right-aligned, text left-aligned."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(isinstance(row[i], int | float) for row in rows) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric)
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and abs(value) < 1000 and not value.is_integer():
        return f"{value:.3g}"
    if isinstance(value, float | int):
        return f"{round(value):,}"
    return str(value)


def plot_compute_vs_communication(
    points: Sequence[tuple[float, float, float, str]], threshold: float, title: str
) -> Figure:
    """Backward compute and data-parallel communication per step against tokens per device,
    `points` as (tokens, backward seconds, communication seconds, bound); the threshold C / W
    as a vertical line."""
    fig = Figure(figsize=(6, 3.6))
    ax = fig.subplots()
    tokens = [p[0] for p in points]
    ax.plot(tokens, [p[1] for p in points], "o-", label="backward compute")
    ax.plot(tokens, [p[2] for p in points], "s-", label="gradient all-reduce")
    ax.axvline(threshold, color="k", ls="--", lw=1, label=f"C / W = {threshold:,.0f} tokens")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens per device per step")
    ax.set_ylabel("seconds per step")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return fig
