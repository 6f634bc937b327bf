"""planner checker: exercise 2: a pipeline's bubble and first-stage activations, predicted."""

from __future__ import annotations

from collections.abc import Callable

from ...course.check import fail, passed, run_on_world
from ..activations import in_flight_microbatches
from ..plan import plan
from ..spec import Layout, ModelSpec
from ._shared import _and, _number, _same

SCHEDULES = ("gpipe", "1f1b")
PIPELINE_CASES = tuple(
    (p, m, kind) for p in (2, 4) for m in (1, 2, 3, 4, 8) for kind in SCHEDULES
)  # (pp, microbatches, schedule): fewer, as many and more micro-batches than stages
RUN_CASES = (("gpipe", 4), ("1f1b", 4))  # (schedule, m) of the real runs, p = 2


def _course_gpt() -> ModelSpec:
    from ...data_parallel.fixture import build
    from ...pipeline.fixture import PP_GPT

    return ModelSpec.of(build("gpt", **PP_GPT).model)


def _planned(spec: ModelSpec, p: int, m: int, kind: str) -> tuple[float, float, int]:
    """(bubble, stage 0's activation bytes, one micro-batch's bytes on stage 0), planned."""
    layout = Layout(pp=p, microbatches=m, schedule=kind, optimizer="sgd", global_batch=m)
    result = plan(spec, layout)
    activations = result.memory["activations"]
    per_microbatch = round(activations / in_flight_microbatches(layout))
    return result.bubble, activations, per_microbatch


def _answer(fn: Callable, p: int, m: int, kind: str, per_mb: int) -> tuple[float, float]:
    out = fn(p, m, kind, per_mb)
    if not isinstance(out, tuple | list) or len(out) != 2:
        fail(f"pipeline_prediction({p}, {m}, {kind!r}, {per_mb}) returned {out!r}; return "
             "(bubble, activation_bytes).")  # fmt: skip
    bubble, activations = (_number(v) for v in out)
    if bubble is None or activations is None:
        fail(f"pipeline_prediction({p}, {m}, {kind!r}, {per_mb}) returned {out!r}: two numbers.")
    return bubble, activations


def _diagnose_bubble(got: float, right: float, p: int, m: int, kind: str) -> str:
    say = f"p = {p}, m = {m}, {kind}: you said bubble = {got:.4g}, the planner {right:.4g}"
    if _same(got, (p - 1) / m):
        return (
            f"{say}. (p-1)/m is the idle time over the useful time (Narayanan et al. 2021's "
            "ratio); the bubble as a share of the step is the idle time over the whole step, "
            "(p-1)/(m+p-1)."
        )
    if _same(got, p / (m + p)) or _same(got, p / (m + p - 1)):
        return (
            f"{say}. The pipeline fills and drains over p-1 slots, not p: the first stage "
            "starts at once, the last waits p-1 forward slots (and the first waits p-1 "
            "backward slots at the end)."
        )
    if kind == "1f1b":
        return (
            f"{say}. 1F1B reorders GPipe's work but does not shorten the fill and the drain: "
            "its bubble is GPipe's, (p-1)/(m+p-1); what it saves is memory."
        )
    return f"{say}. The idle share of the step is (p-1)/(m+p-1)."


def _diagnose_activations(got: float, right: float, p: int, m: int, kind: str, mb: int) -> str:
    say = (f"p = {p}, m = {m}, {kind}: you said {got:,.0f} bytes on the first stage, the "
           f"planner {right:,.0f} ({mb:,} per micro-batch)")  # fmt: skip
    if kind == "1f1b" and _same(got, m * mb):
        return (
            f"{say}. That is GPipe's peak, every micro-batch's forward held until the "
            "backwards start. 1F1B starts a backward as soon as the last stage can: the "
            f"first stage holds at most p = {p} micro-batches (p - stage, stage 0)."
        )
    if kind == "1f1b" and m < p and _same(got, p * mb):
        return (
            f"{say}. There are only m = {m} micro-batches: the first stage holds "
            "min(p, m) of them, never more than exist."
        )
    if kind == "gpipe" and _same(got, min(p, m) * mb):
        return (
            f"{say}. That is 1F1B's peak. GPipe runs every forward before any backward, so "
            f"the first stage holds all m = {m} micro-batches' activations at once."
        )
    if _same(got, max(0, min(p, m) - 1) * mb) or _same(got, (p - 1) * mb):
        return (
            f"{say}. The first stage runs p-1 warm-up forwards, then one more forward "
            "before its first backward: p (or m, if fewer) micro-batches at the peak."
        )
    return f"{say}."


def _run_rank(cases) -> list[dict]:
    """Lesson 09's pipeline on this rank, once per (schedule, m): the peak saved bytes and
    one micro-batch's saved bytes of this stage."""
    from ...pipeline.fixture import pipeline_on_rank

    out = []
    for kind, m in cases:
        r = pipeline_on_rank(kind, m, 2)
        out.append(dict(peak_bytes=r["peak_bytes"], per_mb=r["per_mb"]))
    return out


def check_pipeline_prediction(pipeline_prediction: Callable) -> None:
    """`pipeline_prediction(pp, microbatches, schedule, microbatch_bytes)` against the
    planner, then against the peak activations of real pipelines on 2 ranks."""
    spec = _course_gpt()
    for p, m, kind in PIPELINE_CASES:
        bubble, activations, mb = _planned(spec, p, m, kind)
        got_bubble, got_activations = _answer(pipeline_prediction, p, m, kind, mb)
        if not _same(got_bubble, bubble):
            fail(_diagnose_bubble(got_bubble, bubble, p, m, kind))
        if not _same(got_activations, activations):
            fail(_diagnose_activations(got_activations, activations, p, m, kind, mb))
    runs = run_on_world(_run_rank, 2, RUN_CASES, timeout_s=120)[0]  # stage 0
    measured = []
    for (kind, m), run in zip(RUN_CASES, runs):
        _, predicted = _answer(pipeline_prediction, 2, m, kind, run["per_mb"])
        if not _same(predicted, run["peak_bytes"]):
            fail(
                f"the planner agrees with you, but {kind} with p = 2, m = {m} held "
                f"{run['peak_bytes']:,} bytes on its first stage, not {predicted:,.0f}: the "
                "planner and the run disagree, a bug in minidist (please report it)."
            )
        measured.append(f"{kind} {run['peak_bytes']:,} B")
    passed(
        f"pipeline_prediction equals the planner's bubble and first-stage activations for "
        f"p = {_and((2, 4))}, m = {_and((1, 2, 3, 4, 8))}, GPipe and 1F1B; real runs with "
        f"p = 2, m = 4 held {' and '.join(measured)} on stage 0, as you predicted"
    )
