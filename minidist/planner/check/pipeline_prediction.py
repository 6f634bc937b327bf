"""planner checker: exercise 2: a pipeline's bubble and first-stage activations, predicted."""

from __future__ import annotations

from collections.abc import Callable

from ...course.check import fail, passed, run_on_world
from ..activations import in_flight_microbatches
from ..plan import plan
from ..spec import Layout, ModelSpec
from ._shared import _and, _number, _same, call_learner

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


HINTS = {
    ZeroDivisionError: "A division by zero: the step lasts m + p - 1 slots (m >= 1, p >= 2 "
    "here); nothing in the rule divides by p - 1 or by m - p.",
    TypeError: "A type error: pp and microbatches are ints, schedule a string ('gpipe' or "
    "'1f1b'), microbatch_bytes an int; return a tuple of two numbers.",
    KeyError: "The checker asks for schedule 'gpipe' and '1f1b' (lower case), with p = 2 or 4 "
    "and m from 1 to 8.",
    IndexError: "An index out of range: nothing here is a list; p, m and the bytes are numbers.",
}


def _answer(fn: Callable, p: int, m: int, kind: str, per_mb: int) -> tuple[float, float]:
    call = f"pipeline_prediction({p}, {m}, {kind!r}, {per_mb})"
    out = call_learner(fn, call, HINTS, p, m, kind, per_mb)
    if not isinstance(out, tuple | list) or len(out) != 2:
        fail(f"{call} returned {out!r}; return (bubble, activation_bytes).")
    bubble, activations = (_number(v) for v in out)
    if bubble is None or activations is None:
        fail(f"{call} returned {out!r}: two numbers.")
    return bubble, activations


# -- readings of the rule: the bubble, and how many micro-batches the first stage holds ---------


def _right_bubble(p: int, m: int, kind: str) -> float:
    return (p - 1) / (m + p - 1)


BUBBLES = {  # name -> (the bubble under this reading, what is wrong with it)
    "ratio": (
        lambda p, m, k: (p - 1) / m,
        "(p-1)/m is Narayanan et al. 2021's bubble over the ideal time (the time without "
        "a bubble); the exercise asks for the idle share of the whole step, idle over "
        "total: (p-1)/(m+p-1)",
    ),
    "p_slots": (
        lambda p, m, k: p / (m + p),
        "The pipeline fills and drains over p-1 slots, not p: the first stage starts "
        "at once, the last waits p-1 forward slots",
    ),
    "p_over": (
        lambda p, m, k: p / (m + p - 1),
        "The pipeline fills and drains over p-1 slots, not p: the first stage starts "
        "at once, the last waits p-1 forward slots",
    ),
    "denominator": (
        lambda p, m, k: (p - 1) / (m + p),
        "The step lasts m + p - 1 slots (m of work, p-1 of fill and drain), not m + p",
    ),
    "twice": (
        lambda p, m, k: 2 * (p - 1) / (m + 2 * (p - 1)),
        "Fill and drain are not two separate p-1 waits in the step's units: a slot here "
        "is one forward plus one backward, so the idle time is (p-1) slots of m+p-1",
    ),
    "percent": (
        lambda p, m, k: 100 * _right_bubble(p, m, k),
        "The bubble is a fraction of the step (0 to 1), not a percentage",
    ),
    "busy": (
        lambda p, m, k: 1 - _right_bubble(p, m, k),
        "That is the share of the step a stage is busy, m/(m+p-1); the bubble is the idle "
        "share, 1 minus it",
    ),
    "slots": (
        lambda p, m, k: p - 1,
        "The bubble is not p-1, the idle time in slots, but a share of the step: divide "
        "by its m+p-1 slots",
    ),
    "zero": (
        lambda p, m, k: 0.0,
        "A bubble of 0 (integer division // of p-1 by m+p-1, or no bubble at all): the "
        "pipeline idles (p-1)/(m+p-1) of the step while it fills and drains",
    ),
    "1f1b_none": (
        lambda p, m, k: 0.0 if k == "1f1b" else _right_bubble(p, m, k),
        "1F1B reorders GPipe's work but does not shorten the fill and the drain: its "
        "bubble is GPipe's, (p-1)/(m+p-1); what it saves is memory",
    ),
    "1f1b_halved": (
        lambda p, m, k: (p - 1) / (2 * m + p - 1) if k == "1f1b" else _right_bubble(p, m, k),
        "1F1B reorders GPipe's work but does not shorten the fill and the drain: "
        "its bubble is GPipe's, (p-1)/(m+p-1) (only interleaving, with v chunks "
        "per stage, divides the idle slots by v)",
    ),
}


def _right_held(p: int, m: int, kind: str) -> int:
    return m if kind == "gpipe" else min(p, m)


HELD = {  # name -> (micro-batches held under this reading, what is wrong with it)
    "all": (
        lambda p, m, k: m,
        "That is GPipe's peak, every micro-batch's forward held until the backwards "
        "start. 1F1B starts a backward as soon as the last stage can: the first stage holds "
        "at most p micro-batches (p - stage, stage 0)",
    ),
    "no_min": (
        lambda p, m, k: m if k == "gpipe" else p,
        "There are only m micro-batches: the first stage holds min(p, m) of them, never "
        "more than exist",
    ),
    "gpipe_as_1f1b": (
        lambda p, m, k: min(p, m),
        "That is 1F1B's peak. GPipe runs every forward before any backward, so "
        "the first stage holds all m micro-batches' activations at once",
    ),
    "gpipe_p": (
        lambda p, m, k: p if k == "gpipe" else min(p, m),
        "GPipe runs every forward before any backward, so the first stage holds all m "
        "micro-batches' activations at once, however many stages there are",
    ),
    "one_less": (
        lambda p, m, k: _right_held(p, m, k) - 1,
        "One micro-batch short: GPipe's first stage holds all m (every forward runs "
        "before any backward); 1F1B's runs p-1 warm-up forwards, then one more forward "
        "before its first backward, min(p, m) at the peak",
    ),
    "p_minus_1": (
        lambda p, m, k: p - 1,
        "The first stage runs p-1 warm-up forwards, then one more forward before its "
        "first backward: p (or m, if fewer) micro-batches at the peak",
    ),
    "one": (
        lambda p, m, k: 1,
        "A stage holds every micro-batch whose forward ran and whose backward has not, not one",
    ),
    "max": (
        lambda p, m, k: max(p, m) if k == "1f1b" else m,
        "1F1B's first stage holds min(p, m) micro-batches, not max(p, m)",
    ),
    "in_flight": (
        lambda p, m, k: m + p - 1 if k == "1f1b" else m,
        "m + p - 1 is the step's length in slots, not what the first stage holds: "
        "min(p, m) for 1F1B",
    ),
    "all_stages": (
        lambda p, m, k: p * _right_held(p, m, k),
        "That is every stage's activations, p times the first's: the question is "
        "the first stage's peak (each stage saves its own layers' activations)",
    ),
}
_BYTES = "The argument microbatch_bytes is already in bytes: do not"
SCALES = {  # a unit mistake on top of any reading
    1: "",
    4: f"{_BYTES} multiply it by 4 (float32's size)",
    8: f"{_BYTES} multiply it by 8 (bits)",
    0.25: f"{_BYTES} divide it by 4",
}


def _best(readings: dict, right: Callable, got: dict, which: int, case) -> str | None:
    """The reading that reproduces the wrong `case` and most of the learner's other
    answers (`got[(p, m, kind)] = (bubble, activation bytes, per micro-batch)`)."""
    p, m, kind = case
    best, score = None, -1
    for name, (fn, _) in [("right", (right, "")), *readings.items()]:
        for scale, why in SCALES.items():
            if name == "right" and scale == 1:
                continue
            per = (lambda c: got[c][2]) if which else (lambda c: 1)

            def value(c, fn=fn, scale=scale, per=per):
                return scale * fn(*c) * per(c)

            if not _same(got[case][which], value(case)):
                continue
            agree = sum(_same(got[c][which], value(c)) for c in got)
            if agree > score:
                best, score = (readings[name][1] if name != "right" else "", why), agree
    if best is None:
        return None
    return ". ".join(w for w in best if w) + "."


def _diagnose_bubble(got: dict, right: float, case) -> str:
    p, m, kind = case
    say = f"p = {p}, m = {m}, {kind}: you said bubble = {got[case][0]:.4g}, the planner {right:.4g}"
    why = _best(BUBBLES, _right_bubble, got, 0, case)
    return f"{say}. " + (why or "The idle share of the step is (p-1)/(m+p-1), idle over total.")


def _diagnose_activations(got: dict, right: float, case) -> str:
    p, m, kind = case
    mb = got[case][2]
    say = (
        f"p = {p}, m = {m}, {kind}: you said {got[case][1]:,.0f} bytes on the first stage, "
        f"the planner {right:,.0f} ({mb:,} per micro-batch)"
    )
    why = _best(HELD, _right_held, got, 1, case)
    held = right / mb
    return f"{say}. " + (
        why
        or f"The first stage holds {held:g} micro-batches here ({right / mb:g} × {mb:,}); "
        f"you said {got[case][1] / mb:.4g} of them."
    )


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
    got, right = {}, {}  # (p, m, kind) -> (bubble, activation bytes[, per micro-batch])
    for case in PIPELINE_CASES:
        bubble, activations, mb = _planned(spec, *case)
        got[case] = (*_answer(pipeline_prediction, *case, mb), mb)
        right[case] = (bubble, activations)
    first = next(iter(got))
    if not _same(got[first][0], right[first][0]) and _same(got[first][0], right[first][1]):
        fail(
            f"pipeline_prediction{first[:3] + (got[first][2],)} returned the activation bytes "
            "first: return (bubble, activation_bytes), in that order."
        )
    for case in PIPELINE_CASES:
        if not _same(got[case][0], right[case][0]):
            fail(_diagnose_bubble(got, right[case][0], case))
    for case in PIPELINE_CASES:
        if not _same(got[case][1], right[case][1]):
            fail(_diagnose_activations(got, right[case][1], case))
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
