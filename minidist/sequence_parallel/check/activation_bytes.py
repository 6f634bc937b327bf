"""Lesson 14, exercise 2: Korthikanti's activation bytes with sequence parallelism."""

from __future__ import annotations

import inspect
import math
import numbers
from fractions import Fraction

import torch

from ...course.check import call_learner, fail, passed
from ...course.guard import guarded

ACT_GRID = [
    (2048, 1, 12288, 96, 8),  # GPT-3 175B's layer, t = 8
    (2048, 4, 4096, 32, 4),
    (1024, 2, 1536, 16, 2),
    (512, 3, 1000, 10, 3),  # t that divides nothing evenly
    (500, 1, 1000, 7, 3),  # a total that is not a multiple of t either
    (128, 1, 64, 4, 1),
    (96, 5, 120, 6, 5),
    (300, 2, 768, 12, 6),
    (64, 7, 512, 8, 7),
    (1000, 3, 2048, 16, 16),
    (250, 9, 300, 5, 2),
    (40, 2, 96, 24, 12),
    (5, 1, 7, 1, 3),  # small layers whose bytes per rank are not whole: 438.33, 654.43, ...
    (9, 1, 11, 3, 7),
    (11, 2, 13, 1, 6),
]


def _right(s, b, h, a, t):
    return s * b * h * (34 / t + 5 * a * s / (h * t))


_MISTAKE_NAMES = (
    "tensor parallelism's formula: the 10·s·b·h outside the regions is not divided by t "
    "(that is what sequence parallelism splits)",
    "nothing divided by t (that is one GPU's s·b·h·(34 + 5·a·s/h))",
    "the attention scores' 5·a·s/h not divided by t (they are split with the heads)",
    "the attention term divided by t twice",
    "s·b·h·(34/t) without the attention scores' 5·a·s/(h·t)",
    "elements, not bytes (the formula's 34 counts 16-bit values as 2 bytes): half of it",
    "the scores as a·s/h instead of 5·a·s/h (the softmax, its dropout mask and output are 5 "
    "bytes per score)",
    "s² where the formula has s (5·a·s²·b is the scores' bytes, s·b·h·5·a·s/h)",
    "each term rounded down to a whole number ({how}): 34/t and 5·a·s/(h·t) are not whole "
    "numbers; the sizes need not divide",
    "the total rounded down to a whole number of bytes ({how}): the bytes need not be a "
    "multiple of t; divide as floats",
    "5·a·s·b for the scores: they are s × s per head and sequence, 5·a·s²·b bytes",
    "h where the scores need a (heads): 5·a·s²·b, one s × s matrix per head",
)
_MISTAKE_FNS = (
    lambda s, b, h, a, t: s * b * h * (10 + 24 / t + 5 * a * s / (h * t)),
    lambda s, b, h, a, t: s * b * h * (34 + 5 * a * s / h),
    lambda s, b, h, a, t: s * b * h * (34 / t + 5 * a * s / h),
    lambda s, b, h, a, t: s * b * h * (34 / t + 5 * a * s / (h * t * t)),
    lambda s, b, h, a, t: s * b * h * 34 / t,
    lambda s, b, h, a, t: _right(s, b, h, a, t) / 2,
    lambda s, b, h, a, t: s * b * h * (34 / t + a * s / (h * t)),
    lambda s, b, h, a, t: s * b * h * (34 / t + 5 * a * s * s / (h * t)),
    lambda s, b, h, a, t: s * b * h * (34 // t + 5 * a * s // (h * t)),
    lambda s, b, h, a, t: (34 * s * b * h + 5 * a * s * s * b) // t,
    lambda s, b, h, a, t: (34 * s * b * h + 5 * a * s * b) / t,
    lambda s, b, h, a, t: (34 * s * b * h + 5 * h * s * s * b) / t,
)
ACT_MISTAKES = dict(zip(_MISTAKE_NAMES, _MISTAKE_FNS))

# The terms a formula for one layer's bytes is made of, right or wrong: the paper's are
# 34·s·b·h/t and 5·a·s²·b/t; a slip moves a coefficient to a neighbouring term (t forgotten,
# t twice, s for s², h for a) or scales it.
TERMS = {
    "s·b·h/t": (lambda s, b, h, a, t: s * b * h / t, 34),
    "a·s²·b/t": (lambda s, b, h, a, t: a * s * s * b / t, 5),
    "s·b·h": (lambda s, b, h, a, t: s * b * h, 0),
    "a·s²·b": (lambda s, b, h, a, t: a * s * s * b, 0),
    "s·b·h/t²": (lambda s, b, h, a, t: s * b * h / t**2, 0),
    "a·s²·b/t²": (lambda s, b, h, a, t: a * s * s * b / t**2, 0),
    "a·s·b/t": (lambda s, b, h, a, t: a * s * b / t, 0),
    "h·s²·b/t": (lambda s, b, h, a, t: h * s * s * b / t, 0),
    "a·s³·b/t": (lambda s, b, h, a, t: a * s**3 * b / t, 0),
}


def _how(fn) -> str:
    """How the learner rounded down, from their source when it can be read."""
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        return "//, int() or math.floor"
    found = [
        w for w, pat in (("//", "//"), ("int()", "int("), ("math.floor", "floor")) if pat in src
    ]
    return " and ".join(found) if found else "//, int() or math.floor"


def _terms(got: dict) -> str | None:
    """The learner's formula as coefficients of `TERMS`, when it is one exactly: which term
    is off and by what factor. None when no combination fits."""
    names = list(TERMS)
    cols = [[TERMS[n][0](*c) for n in names] for c in ACT_GRID]
    a = torch.tensor(cols, dtype=torch.float64, device="cpu")
    y = torch.tensor([got[c] for c in ACT_GRID], dtype=torch.float64, device="cpu")
    scale = a.abs().max(0).values.clamp_min(1e-300)
    coef = torch.linalg.lstsq(a / scale, y.unsqueeze(-1)).solution.squeeze(-1) / scale
    coef = [Fraction(float(x)).limit_denominator(8) for x in coef]
    fit = [sum(float(k) * v for k, v in zip(coef, row)) for row in cols]
    if not all(math.isclose(f, got[c], rel_tol=1e-9) for f, c in zip(fit, ACT_GRID)):
        return None
    slips = []
    for name, k in zip(names, coef):
        want = TERMS[name][1]
        if k == want:
            continue
        if want == 0:
            slips.append(f"a term {k}·{name} that the paper does not have")
        elif k == 0:
            slips.append(f"no {want}·{name} term (the paper has one)")
        else:
            slips.append(f"{k}·{name} where the paper has {want}·{name} ({float(k / want):.3g}x)")
    return "; ".join(slips) if slips else None


def check_sp_activation_bytes(fn) -> None:
    """`fn(s, b, h, a, t)` against Korthikanti's s·b·h·(34/t + 5·a·s/(h·t)) on a grid."""
    got = {}
    for case in ACT_GRID:
        value = call_learner(fn, *case, what=f"fn{case}")
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            fail(f"fn{case} returned {value!r}; return the number of bytes (an int or float).")
        got[case] = float(value)
    wrong = [c for c in ACT_GRID if not math.isclose(got[c], _right(*c), rel_tol=1e-9)]
    if not wrong:
        passed(
            f"s·b·h·(34/t + 5·a·s/(h·t)) on {len(ACT_GRID)} layers, t = 1 to 16 (GPT-3's "
            f"layer at t = 8: {_right(*ACT_GRID[0]) / 2**30:.2f} GiB per rank)"
        )
        return
    as_f32 = [float(torch.tensor(_right(*c), dtype=torch.float32, device="cpu")) for c in ACT_GRID]
    if all(got[c] == f for c, f in zip(ACT_GRID, as_f32)):
        fail(
            "your formula is right but computed in float32 (a torch tensor's default dtype): "
            "its 24-bit mantissa rounds byte counts above 16 M (GPT-3's layer is off by "
            f"{abs(as_f32[0] - _right(*ACT_GRID[0])):.3g} bytes). Use Python numbers, or "
            "dtype=torch.float64."
        )
    for name, predict in ACT_MISTAKES.items():
        if all(math.isclose(got[c], predict(*c), rel_tol=1e-9) for c in ACT_GRID):
            fail(f"your formula matches a known mistake: {name.format(how=_how(fn))}.")
    c = wrong[0]
    s, b, h, a, t = c
    where = (
        f"for s={s}, b={b}, h={h}, a={a}, t={t} you return {got[c]:.6g} bytes, the paper's "
        f"s·b·h·(34/t + 5·a·s/(h·t)) = 34·s·b·h/t + 5·a·s²·b/t gives {_right(*c):.6g} "
        f"({got[c] / _right(*c):.4g}x); {len(wrong)} of {len(ACT_GRID)} layers differ"
    )
    slips = guarded(_terms, "", got)
    if slips and "could not say" not in slips:
        fail(f"your formula is {slips}: {where}.")
    fail(f"{where}.")
