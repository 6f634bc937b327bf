"""Lesson 14, exercise 2: Korthikanti's activation bytes with sequence parallelism."""

from __future__ import annotations

import math

import torch

from ...course.check import fail, passed

ACT_GRID = [
    (2048, 1, 12288, 96, 8),  # GPT-3 175B's layer, t = 8
    (2048, 4, 4096, 32, 4),
    (1024, 2, 1536, 16, 2),
    (512, 3, 1000, 10, 3),  # t that divides nothing evenly
    (500, 1, 1000, 7, 3),  # a total that is not a multiple of t either
    (128, 1, 64, 4, 1),
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
    "integer division (//) somewhere: the sizes need not divide",
    "the total divided by t with // (an integer): the bytes need not be a multiple of t",
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


def check_sp_activation_bytes(fn) -> None:
    """`fn(s, b, h, a, t)` against Korthikanti's s·b·h·(34/t + 5·a·s/(h·t)) on a grid."""
    got = {}
    for case in ACT_GRID:
        try:
            value = fn(*case)
        except NotImplementedError:
            raise
        except Exception as exc:  # a learner's crash becomes a message
            fail(f"fn{case} raised {type(exc).__name__}: {exc}")
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if not isinstance(value, int | float) or isinstance(value, bool):
            fail(f"fn{case} returned {value!r}; return the number of bytes (an int or float).")
        got[case] = float(value)
    wrong = [c for c in ACT_GRID if not math.isclose(got[c], _right(*c), rel_tol=1e-9)]
    if not wrong:
        passed(
            f"s·b·h·(34/t + 5·a·s/(h·t)) on {len(ACT_GRID)} layers, t = 1 to 8 (GPT-3's "
            f"layer at t = 8: {_right(*ACT_GRID[0]) / 2**30:.2f} GiB per rank)"
        )
        return
    for name, predict in ACT_MISTAKES.items():
        if all(math.isclose(got[c], predict(*c), rel_tol=1e-9) for c in ACT_GRID):
            fail(f"your formula matches a known mistake: {name}.")
    c = wrong[0]
    s, b, h, a, t = c
    fail(
        f"for s={s}, b={b}, h={h}, a={a}, t={t} you return {got[c]:.6g} bytes; the paper's "
        f"s·b·h·(34/t + 5·a·s/(h·t)) gives {_right(*c):.6g} ({got[c] / _right(*c):.4g}x): "
        f"{len(wrong)} of {len(ACT_GRID)} layers differ."
    )
