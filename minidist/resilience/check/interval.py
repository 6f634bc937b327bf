"""resilience checker: exercise 1: Young's and Daly's checkpoint intervals."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from ...course.check import call_learner, fail, passed
from ..theory import daly_interval, llama3_mtbf, young_interval


def _cases() -> list[tuple[float, float]]:
    """(δ, M) pairs: Llama 3's M with saves of 10 s to 10 min, a seeded sample of the space
    (δ from 0.1 s to an hour, M from a minute to a year, log-uniform), δ ≥ 2M."""
    rng = random.Random(18)
    out = [(30.0, llama3_mtbf()), (600.0, llama3_mtbf()), (10.0, llama3_mtbf())]
    for _ in range(12):
        out.append((10 ** rng.uniform(-1, 3.5), 10 ** rng.uniform(1.8, 7.5)))
    return out + [(5000.0, 2000.0), (100.0, 50.0)]


INTERVAL_CASES = _cases()

HINTS = {
    r"math domain error": "a negative number under a square root: when δ ≥ 2M Daly's series "
    "no longer applies, and the optimum is M itself (return it before the series)",
    r"ZeroDivisionError": "a division by zero: the inputs are δ > 0 and M > 0 seconds",
    r"TypeError": "return a pair of numbers, (young, daly), both in seconds",
}


def _young_readings(d: float, m: float) -> dict[str, float]:
    return {
        "√(δ·M): the factor 2 under the root is missing (Young: τ = √(2δM))": math.sqrt(d * m),
        "2·δ·M: the square root is missing (Young: τ = √(2δM))": 2 * d * m,
        "√(2δ/M): δ divided by M, not multiplied (Young: τ = √(2δM))": math.sqrt(2 * d / m),
        "√(2M/δ): M divided by δ, not multiplied (Young: τ = √(2δM))": math.sqrt(2 * m / d),
        "Young's interval in hours: keep seconds": young_interval(d, m) / 3600,
        "Young's interval in minutes: keep seconds": young_interval(d, m) / 60,
        "Daly's interval for Young's": daly_interval(d, m),
    }


def _daly_series(d: float, m: float, third=True, ninth=True, minus=True, sqrt=True,
                 half=True, cap=True) -> float:  # fmt: skip
    if cap and d >= 2 * m:
        return m
    x = d / (2 * m) if half else d / m
    t = math.sqrt(2 * d * m) * (1 + (math.sqrt(x) if sqrt else x) / 3 * third + x / 9 * ninth)
    return t - d * minus


def _daly_readings(d: float, m: float) -> dict[str, float]:
    out = {
        "Daly's interval without its −δ (the save's own time comes off: τ = ... − δ)":
            _daly_series(d, m, minus=False),
        "Daly's interval without its ⅓·√(δ/2M) term": _daly_series(d, m, third=False),
        "Daly's interval without its (1/9)·(δ/2M) term": _daly_series(d, m, ninth=False),
        "⅓·(δ/2M) in Daly's interval: the ⅓ term is ⅓·√(δ/2M)": _daly_series(d, m, sqrt=False),
        "δ/M in Daly's interval: the ratio is δ/(2M)": _daly_series(d, m, half=False),
        "Young's interval for Daly's (Daly 2006 adds two terms and subtracts δ)":
            young_interval(d, m),
        "Daly's interval in hours: keep seconds": daly_interval(d, m) / 3600,
    }  # fmt: skip
    if d >= 2 * m:
        out["δ ≥ 2M not handled: Daly's optimum is then M itself (the series does not apply)"] = (
            _daly_series(d, m, cap=False)
        )
    return out


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(b))


def _number(v) -> float | None:
    if isinstance(v, bool):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _diagnose(d: float, m: float, got) -> str | None:
    want = (young_interval(d, m), daly_interval(d, m))
    what = f"checkpoint_interval(save_s={d:g}, mtbf_s={m:g})"
    if not isinstance(got, tuple | list) or len(got) != 2:
        return f"{what} returned {got!r}: return a pair, (young, daly), in seconds"
    y, dl = _number(got[0]), _number(got[1])
    if y is None or dl is None or not (math.isfinite(y) and math.isfinite(dl)):
        return f"{what} returned {got!r}: both must be finite numbers of seconds"
    if _same(y, want[1]) and _same(dl, want[0]) and not _same(y, want[0]):
        return f"{what} returned ({y:g}, {dl:g}): the pair is swapped: return (young, daly)"
    rule = f"want young = {want[0]:.6g} s, daly = {want[1]:.6g} s"
    if not _same(y, want[0]):
        for reading, value in _young_readings(d, m).items():
            if _same(y, value):
                return f"{what}: young = {y:.6g} s is {reading}; {rule}"
        return f"{what}: young = {y:.6g} s; {rule} (Young 1974: √(2·δ·M))"
    if not _same(dl, want[1]):
        for reading, value in _daly_readings(d, m).items():
            if _same(dl, value):
                return f"{what}: daly = {dl:.6g} s is {reading}; {rule}"
        return (f"{what}: daly = {dl:.6g} s; {rule} (Daly 2006: √(2δM)·(1 + ⅓·√(δ/2M) + "
                "(1/9)·(δ/2M)) − δ, or M when δ ≥ 2M)")  # fmt: skip
    return None


def check_checkpoint_interval(checkpoint_interval: Callable) -> None:
    """Compare `checkpoint_interval(save_s, mtbf_s)` with Young's and Daly's intervals."""
    for d, m in INTERVAL_CASES:
        got = call_learner(checkpoint_interval, d, m, hints=HINTS,
                           what=f"checkpoint_interval(save_s={d:g}, mtbf_s={m:g})")  # fmt: skip
        problem = _diagnose(d, m, got)
        if problem:
            fail(problem)
    d, m = 30.0, llama3_mtbf()
    passed(f"Young's and Daly's intervals on {len(INTERVAL_CASES)} (δ, M), δ ≥ 2M included; "
           f"Llama 3 (M = {m / 3600:.2f} h) saving in 30 s: every "
           f"{young_interval(d, m) / 60:.1f} min")  # fmt: skip
