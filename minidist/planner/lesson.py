"""Lesson 13's entry in the tour: "planner", a plan checked against a run.

The planner predicts one course layout before it runs: ZeRO-2 of the course GPT over every
rank of the world, Adam, float32, ~20 KiB buckets (`course.course_plan("ZeRO-2", world)`,
lesson 02's tour layout). Then lesson 02's rank function trains it (`zero.fixture.
train_on_rank`) against Adam in one process. The row reports the run against its reference
(lesson 02's tolerance, `zero.lesson.TOUR_TOL`) and the plan against the run: model-state
bytes of rank 0 (`Plan.model_state_bytes` against `memory.model_state_bytes`) and bytes rank
0 sent per training step (`Plan.bytes_sent` against the ledger; the comparison contract's
gathers, tag "full-grads", are a check, not training traffic). Both are equal to the byte.
The plan's bars beside the run's, by kind, go to `planner_zero2.png`.

`python -m minidist bench plan` (in `measure.py`) times data and tensor parallelism here
against the step time predicted with this machine's fitted FLOP rate and links.
"""

from __future__ import annotations

from pathlib import Path

from ..registry import TourRow, tour_row
from ..runtime import launch
from ..training import max_abs_diff
from . import measure  # noqa: F401  (registers `python -m minidist bench plan`)
from .course import course_plan

ROW_LAYOUT = "ZeRO-2"
CONTRACT_TAG = "full-grads"


def plan_and_run(world_size: int) -> dict:
    """Plan `ROW_LAYOUT` on `world_size` ranks, run it, and return both, with the reference."""
    from ..zero.fixture import reference, train_on_rank
    from ..zero.lesson import MODEL

    planned = course_plan(ROW_LAYOUT, world_size).plan
    layout = planned.layout
    ref = reference(MODEL)
    runs = launch(train_on_rank, world_size, layout.zero, MODEL, bucket_cap_mb=layout.bucket_cap_mb)
    _, ledger, memory, _ = runs[0]
    steps = len(ref.losses)
    sent = sum(r.ring_bytes for r in ledger.records if r.tag != CONTRACT_TAG) / steps
    return dict(
        plan=planned,
        memory=memory,
        sent=sent,
        diff=max(max_abs_diff(trace.params, ref.params) for trace, *_ in runs),
    )


@tour_row("planner", lesson=13)
def planner_row(world_size: int, out_dir: Path) -> TourRow:
    import matplotlib.pyplot as plt

    from ..zero.lesson import TOUR_TOL
    from .lesson_plots import plot_plan_vs_measured

    r = plan_and_run(world_size)
    p, memory = r["plan"], r["memory"]
    kinds = ("params", "grads", "optimizer")
    bars = {kind: (p.memory[kind], getattr(memory, kind)) for kind in kinds}
    bars["sent per step"] = (p.bytes_sent, r["sent"])
    fig = plot_plan_vs_measured(bars, f"{ROW_LAYOUT} on {world_size} ranks: plan vs run, rank 0")
    fig.savefig(out_dir / "planner_zero2.png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return TourRow(
        f"planner ({ROW_LAYOUT}, planned then run)",
        r["diff"] < TOUR_TOL,
        r["diff"],
        memory_per_rank=memory.total,
        memory_theory=int(p.model_state_bytes),
        bytes_per_rank=r["sent"],
        bytes_theory=p.bytes_sent,
    )
