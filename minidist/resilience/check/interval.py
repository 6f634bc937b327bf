"""resilience checker: exercise 1: Young's and Daly's checkpoint intervals.

Every case is asked first; a catalogued reading (a formula with one named slip) is named only
when it gives the learner's number on every case where that number is wrong; otherwise the
message is the first wrong case and the formula, without a guessed cause.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from ...course.check import call_learner, fail, passed
from ..theory import daly_interval, llama3_mtbf, young_interval


def _cases() -> list[tuple[float, float]]:
    """(δ, M) pairs: Llama 3's M with saves of 10 s to 10 min, a seeded sample of the space
    (δ from 0.1 s to an hour, M from a minute to a year, log-uniform), M ≤ δ < 2M (where a
    cap at δ ≥ M would already return M) and δ ≥ 2M."""
    rng = random.Random(18)
    out = [(30.0, llama3_mtbf()), (600.0, llama3_mtbf()), (10.0, llama3_mtbf())]
    for _ in range(12):
        out.append((10 ** rng.uniform(-1, 3.5), 10 ** rng.uniform(1.8, 7.5)))
    return out + [(1500.0, 1000.0), (70.0, 60.0), (5000.0, 2000.0), (100.0, 50.0)]


INTERVAL_CASES = _cases()

HINTS = {
    r"math domain error": "a negative number under a square root: when δ ≥ 2M Daly's series "
    "no longer applies, and the optimum is M itself (return it before the series)",
    r"ZeroDivisionError": "a division by zero: the inputs are δ > 0 and M > 0 seconds",
    r"TypeError": "return a pair of numbers, (young, daly), both in seconds",
}


def _series(
    d: float,
    m: float,
    third=True,
    ninth=True,
    minus=True,
    root=math.sqrt,
    third_root=math.sqrt,
    ratio=lambda d, m: d / (2 * m),
    cap=2.0,
) -> float:
    """Daly's interval, or one reading of it with a named part changed."""
    if cap and d >= cap * m:
        return m
    x = ratio(d, m)
    return root(2 * d * m) * (1 + third_root(x) / 3 * third + x / 9 * ninth) - d * minus


def _slip(v: float) -> float:
    """`v ** 1/2` in Python: (v ** 1) / 2, since ** binds tighter than /."""
    return v / 2


HOURS = 3600.0
DALY_RULE = "Daly 2006: √(2δM)·(1 + ⅓·√(δ/2M) + (1/9)·(δ/2M)) − δ, or M when δ ≥ 2M"
PRECEDENCE = (
    "** 1/2 is (v ** 1) / 2 in Python (** binds tighter than /), not √v: write ** 0.5 or math.sqrt"
)
YOUNG_READINGS: dict[str, Callable[[float, float], float]] = {
    "√(δ·M): the factor 2 under the root is missing (Young: τ = √(2δM))": lambda d, m: math.sqrt(
        d * m
    ),
    "2·δ·M: the square root is missing (Young: τ = √(2δM))": lambda d, m: 2 * d * m,
    f"δ·M, from (2·δ·M) ** 1/2: {PRECEDENCE}": lambda d, m: _slip(2 * d * m),
    "√(2δ/M): δ divided by M, not multiplied (Young: τ = √(2δM))": lambda d, m: math.sqrt(
        2 * d / m
    ),
    "√(2M/δ): M divided by δ, not multiplied (Young: τ = √(2δM))": lambda d, m: math.sqrt(
        2 * m / d
    ),
    "Young's interval in hours: keep seconds": lambda d, m: young_interval(d, m) / HOURS,
    "60 times too small: Young's interval in minutes, or M taken in hours (mtbf_s is "
    "already in seconds, and so is the answer)": lambda d, m: young_interval(d, m) / 60,
    "rounded to whole seconds: return the exact value (a float)": lambda d, m: round(
        young_interval(d, m)
    ),
    "Daly's interval for Young's": daly_interval,
}
DALY_READINGS: dict[str, Callable[[float, float], float]] = {
    "Daly's interval without its −δ (the save's own time comes off: τ = ... − δ)": lambda d, m: (
        _series(d, m, minus=False)
    ),
    "Daly's interval without its ⅓·√(δ/2M) term": lambda d, m: _series(d, m, third=False),
    "Daly's interval without its (1/9)·(δ/2M) term": lambda d, m: _series(d, m, ninth=False),
    "⅓·(δ/2M) in Daly's interval: the ⅓ term is ⅓·√(δ/2M)": lambda d, m: _series(
        d, m, third_root=lambda v: v
    ),
    "δ/M in Daly's interval: the ratio is δ/(2M)": lambda d, m: _series(
        d, m, ratio=lambda d, m: d / m
    ),
    "δ/2*M in Daly's interval: Python reads it (δ/2)·M; the ratio is δ/(2·M), bracket the "
    "denominator": lambda d, m: _series(d, m, ratio=lambda d, m: d / 2 * m),
    "δ // (2M) in Daly's interval: integer (floor) division makes the ratio 0 whenever "
    "δ < 2M; use /": lambda d, m: _series(d, m, ratio=lambda d, m: d // (2 * m)),
    f"a √ written ** 1/2 in Daly's interval: {PRECEDENCE}": lambda d, m: _series(
        d, m, root=_slip, third_root=_slip
    ),
    "the cap at δ ≥ M: Daly's series holds up to δ < 2M, and the optimum is M only from "
    "δ ≥ 2M": lambda d, m: _series(d, m, cap=1.0),
    "δ ≥ 2M not handled: Daly's optimum is then M itself (the series does not apply)": (
        lambda d, m: _series(d, m, cap=0.0)
    ),
    "Young's interval for Daly's (Daly 2006 adds two terms and subtracts δ)": young_interval,
    "Daly's interval in hours: keep seconds": lambda d, m: daly_interval(d, m) / HOURS,
    "M taken in hours (mtbf_s is already in seconds)": lambda d, m: daly_interval(d, m / HOURS),
    "rounded to whole seconds: return the exact value (a float)": lambda d, m: round(
        daly_interval(d, m)
    ),
}


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(b))


def _number(v) -> float | None:
    if isinstance(v, bool):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _what(d: float, m: float) -> str:
    return f"checkpoint_interval(save_s={d:g}, mtbf_s={m:g})"


def _pair(d: float, m: float, got) -> tuple[float, float]:
    """The learner's (young, daly) as floats, or a failure naming what came back."""
    if not isinstance(got, tuple | list) or len(got) != 2:
        fail(f"{_what(d, m)} returned {got!r}: return a pair, (young, daly), in seconds")
    y, dl = _number(got[0]), _number(got[1])
    if y is None or dl is None or not (math.isfinite(y) and math.isfinite(dl)):
        fail(f"{_what(d, m)} returned {got!r}: both must be finite numbers of seconds")
    return y, dl


def _reads(reading: Callable, d: float, m: float, value: float) -> bool:
    try:
        return _same(value, reading(d, m))
    except (ArithmeticError, ValueError):
        return False


def _named(readings: dict, wrong: list[tuple[float, float, float]]) -> str | None:
    """The reading that gives the learner's value on every wrong case, if one does."""
    return next(
        (text for text, f in readings.items() if all(_reads(f, d, m, v) for d, m, v in wrong)), None
    )


def _diagnose(answers: list[tuple[float, float, float, float]]) -> str | None:
    want = {(d, m): (young_interval(d, m), daly_interval(d, m)) for d, m, _, _ in answers}
    bad = [
        (d, m, y, dl)
        for d, m, y, dl in answers
        if not (_same(y, want[d, m][0]) and _same(dl, want[d, m][1]))
    ]
    if not bad:
        return None
    if all(_same(y, want[d, m][1]) and _same(dl, want[d, m][0]) for d, m, y, dl in bad):
        d, m, y, dl = bad[0]
        return f"{_what(d, m)} returned ({y:g}, {dl:g}): the pair is swapped: return (young, daly)"
    for part, readings, rule in (
        (0, YOUNG_READINGS, "Young 1974: √(2·δ·M)"),
        (1, DALY_READINGS, DALY_RULE),
    ):
        wrong = [(d, m, a[part]) for d, m, *a in bad if not _same(a[part], want[d, m][part])]
        if not wrong:
            continue
        d, m, v = wrong[0]
        label = ("young", "daly")[part]
        right = f"want young = {want[d, m][0]:.6g} s, daly = {want[d, m][1]:.6g} s"
        reading = _named(readings, wrong)
        if reading:
            return f"{_what(d, m)}: {label} = {v:.6g} s is {reading}; {right}"
        return f"{_what(d, m)}: {label} = {v:.6g} s; {right} ({rule})"
    return None


def check_checkpoint_interval(checkpoint_interval: Callable) -> None:
    """Compare `checkpoint_interval(save_s, mtbf_s)` with Young's and Daly's intervals."""
    answers = []
    for d, m in INTERVAL_CASES:
        got = call_learner(checkpoint_interval, d, m, hints=HINTS, what=_what(d, m))
        answers.append((d, m, *_pair(d, m, got)))
    problem = _diagnose(answers)
    if problem:
        fail(problem)
    d, m = 30.0, llama3_mtbf()
    passed(
        f"Young's and Daly's intervals on {len(INTERVAL_CASES)} (δ, M), M ≤ δ < 2M and "
        f"δ ≥ 2M included; Llama 3 (M = {m / 3600:.2f} h) saving in 30 s: every "
        f"{young_interval(d, m) / 60:.1f} min"
    )
