"""Checkers for the exercises of lesson 10 (3D parallelism). Pure functions: no world.

1. `check_rank_of(rank_of)`: `rank_of(tp_rank, pp_rank, dp_rank, tp, pp, dp)` returns the
   global rank of a grid position in Megatron-LM's layout (Narayanan et al. 2021, section 3;
   `minidist.megatron.layout.parallel_groups`): tp groups are t consecutive ranks, a stage is
   a block of t·d ranks, dp groups take every t-th rank inside it. Compared with the groups
   of `parallel_groups` for several (t, p, d). Named mistakes (`check_mistakes.py`): tp and
   dp swapped, pipeline stages contiguous, tp outermost, stages stepped by t·p or dp by d,
   stages backwards, ranks from 1; a rank outside the world, two positions on one rank, a
   non-int; otherwise which positions and axes differ.
2. `check_bytes_per_step(bytes_per_step)`: `bytes_per_step(stage, tp, pp, dp, trainable,
   **sizes)` returns {"tp", "pp", "dp"}: bytes one rank of `stage` sends per step on each
   group kind. Compared with `theory.bytes_sent_per_step` on the course GPT and on layer
   counts p does not divide (5 and 7 layers). Each wrong kind is named from
   `BYTE_MISTAKES` (the variant that matches every case): layers // pp blocks (or floor,
   ceil boundaries), the tp bytes on a ring of d or as payloads, the first/last stages'
   extra all-reduces on every stage, the global batch, the tied embedding's all-reduce
   missing, of the whole vocabulary, unpadded, on every stage or with p = 1, activations
   both ways at the ends, tp bytes added to dp, ZeRO-1's all-gather forgotten, an
   all-reduce of the unpadded gradients, elements for bytes, payloads for ring bytes;
   otherwise how many cases differ and by what factor. A learner's exception is reported
   with its line and likely cause.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable

from ..course.check import fail, passed
from ..megatron.layout import parallel_groups
from ..pipeline.check_call import learner_call
from . import theory
from .check_mistakes import BYTE_MISTAKES, RANK_FAMILIES, variant_bytes

GRID_CASES = ((2, 2, 2), (2, 4, 1), (1, 2, 4), (4, 2, 2), (2, 3, 3), (3, 2, 2))  # (t, p, d)


# -- exercise 1: the rank of a grid position --------------------------------------------------


def reference_rank(tp_rank: int, pp_rank: int, dp_rank: int, tp: int, pp: int, dp: int) -> int:
    """From `parallel_groups`: the rank at index tp_rank of its tp group, etc."""
    groups = parallel_groups(tp * pp * dp, tp, pp)
    (rank,) = {
        r
        for r in range(tp * pp * dp)
        if any(g.index(r) == tp_rank for g in groups["tp"] if r in g)
        and any(g.index(r) == pp_rank for g in groups["pp"] if r in g)
        and any(g.index(r) == dp_rank for g in groups["dp"] if r in g)
    }
    return rank


def _positions(t: int, p: int, d: int):
    return [(i, j, k) for k in range(d) for j in range(p) for i in range(t)]


HINTS_1 = {"TypeError": "the arguments are (tp_rank, pp_rank, dp_rank, tp, pp, dp), six ints"}


def _diagnose_grid(rank_of: Callable, t: int, p: int, d: int) -> str | None:
    n, where = t * p * d, f"t = {t}, p = {p}, d = {d}"
    got = {}
    for pos in _positions(t, p, d):
        call = f"rank_of{(*pos, t, p, d)}"
        value = learner_call(rank_of, *pos, t, p, d, call=call, hints=HINTS_1)
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            return f"{where}: {call} returned {value!r}; return an int."
        got[pos] = int(value)
    right = {pos: reference_rank(*pos, t, p, d) for pos in got}
    if got == right:
        return None
    for formula, message in RANK_FAMILIES:
        if all(got[pos] == formula(*pos, t, p, d) for pos in got):
            pos = next(q for q in got if got[q] != right[q])
            return (
                f"{where}: {message} E.g. rank_of{(*pos, t, p, d)} = {got[pos]}, not {right[pos]}."
            )
    outside = [pos for pos, r in got.items() if not 0 <= r < n]
    if outside:
        return f"{where}: rank_of{(*outside[0], t, p, d)} = {got[outside[0]]} is not in 0..{n - 1}."
    if len(set(got.values())) < n:
        seen: dict[int, tuple] = {}
        for pos, r in got.items():
            if r in seen:
                return f"{where}: positions {seen[r]} and {pos} both map to rank {r}."
            seen[r] = pos
    wrong = [q for q in got if got[q] != right[q]]
    axes = [
        name
        for a, name in enumerate(("tp_rank", "pp_rank", "dp_rank"))
        if len({q[a] for q in wrong}) < len({q[a] for q in got})
    ]
    pos = wrong[0]
    return (
        f"{where}: rank_of{(*pos, t, p, d)} = {got[pos]}, but in parallel_groups that position "
        f"is rank {right[pos]} (tp groups {parallel_groups(n, t, p)['tp'][:2]}...); "
        f"{len(wrong)} of {n} positions differ"
        + (f", only some values of {', '.join(axes)}." if axes else ".")
    )


def check_rank_of(rank_of: Callable) -> None:
    """`rank_of(tp_rank, pp_rank, dp_rank, tp, pp, dp)` against `parallel_groups`."""
    for t, p, d in GRID_CASES:
        problem = _diagnose_grid(rank_of, t, p, d)
        if problem:
            fail(problem)
    grid = [[rank_of(i, j, 0, 2, 2, 2) for i in range(2)] for j in range(2)]
    passed(
        f"rank_of matches parallel_groups on {len(GRID_CASES)} grids (t, p, d); e.g. t = p = "
        f"d = 2: replica 0 is ranks {grid} (stage by stage), its tp groups of neighbours"
    )


# -- exercise 2: bytes per step by group kind -------------------------------------------------

SIZES = dict(layers=4, batch=24, seq=16, hidden=32, vocab=30)  # the course GPT, a batch of 24
# (sizes, layouts (t, p, d)): the course GPT, then layer counts that p does not divide
BYTE_CASES = [
    (SIZES, ((2, 2, 2), (1, 2, 2), (2, 1, 3), (2, 4, 1), (2, 2, 3), (4, 2, 2))),
    (dict(SIZES, layers=5), ((2, 2, 2), (1, 3, 2), (2, 3, 1))),
    (dict(SIZES, layers=7, vocab=31), ((2, 4, 2), (4, 3, 1))),
]
FROZEN = 32  # ln_f.bias, on the last stage
HINTS_2 = {
    "TypeError": "the arguments are (stage, tp, pp, dp, trainable, layers, batch, seq, "
    "hidden, vocab), the last five by name",
    "IndexError": "a stage's blocks: boundaries round(k·layers/pp) for k = 0..pp",
}


def _trainable(stage: int, t: int, p: int, s: dict) -> int:
    return theory.trainable_per_rank(
        stage, p, s["layers"], s["hidden"], s["vocab"], s["seq"], t, FROZEN
    )


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


def _answers(fn: Callable) -> list | str:
    """Every case's (where, switches-free args, the learner's dict, the theory's dict)."""
    out = []
    for sizes, layouts in BYTE_CASES:
        for t, p, d in layouts:
            for stage in range(p):
                where = f"stage {stage} of t = {t}, p = {p}, d = {d}, {sizes['layers']} layers"
                trainable = _trainable(stage, t, p, sizes)
                call = f"bytes_per_step({stage}, {t}, {p}, {d}, {trainable}, **{sizes})"
                got = learner_call(fn, stage, t, p, d, trainable, **sizes, call=call, hints=HINTS_2)
                if not isinstance(got, dict) or set(got) != {"tp", "pp", "dp"}:
                    return (
                        f"{where}: return a dict with keys 'tp', 'pp', 'dp'; you returned {got!r}."
                    )
                right = theory.bytes_sent_per_step(
                    stage,
                    p,
                    sizes["layers"],
                    sizes["batch"],
                    sizes["seq"],
                    sizes["hidden"],
                    sizes["vocab"],
                    t,
                    d,
                    FROZEN,
                )
                args = (stage, t, p, d, trainable)
                out.append((where, args, sizes, {k: float(v) for k, v in got.items()}, right))
    return out


def _diagnose_bytes(fn: Callable) -> str | None:
    """Each wrong key's mistake: the first whose bytes match the learner's in every case."""
    answers = _answers(fn)
    if isinstance(answers, str):
        return answers
    wrong_keys = [
        k
        for k in ("tp", "pp", "dp")
        if any(not _same(got[k], right[k]) for *_, got, right in answers)
    ]
    if not wrong_keys:
        return None
    found = []
    for key in wrong_keys:
        for mistake_key, switches, message in BYTE_MISTAKES:
            if mistake_key == key and all(
                _same(got[key], variant_bytes(*args, **sizes, **switches)[key])
                for _, args, sizes, got, _ in answers
            ):
                found.append(f"{key}: {message}")
                break
        else:
            differ = [
                (got[key], right[key])
                for *_, got, right in answers
                if not _same(got[key], right[key])
            ]
            ratios = sorted({round(g / r, 3) if r else float("inf") for g, r in differ})
            found.append(
                f"{key}: {'all' if len(differ) == len(answers) else len(differ)} of "
                f"{len(answers)} cases differ (e.g. {ratios[0]:g}x the theory"
                + (")." if len(ratios) == 1 else f"; {len(ratios)} different ratios).")
            )
    where, *_, got, right = next(
        a for a in answers if any(not _same(a[3][k], a[4][k]) for k in wrong_keys)
    )
    say = ", ".join(f"{k} {got[k]:.0f} B (theory {right[k]:.0f})" for k in wrong_keys)
    return " ".join(found) + f" [e.g. {where}: you said {say}]"


def check_bytes_per_step(bytes_per_step: Callable) -> None:
    """`bytes_per_step(stage, tp, pp, dp, trainable, **SIZES)` against `theory`."""
    problem = _diagnose_bytes(bytes_per_step)
    if problem:
        fail(problem)
    example = bytes_per_step(0, 2, 2, 2, _trainable(0, 2, 2, SIZES), **SIZES)
    layouts = sum(len(layouts) for _, layouts in BYTE_CASES)
    passed(
        f"bytes_per_step matches theory.bytes_sent_per_step on every stage of {layouts} "
        f"layouts (4, 5 and 7 layers); e.g. stage 0 of t = p = d = 2: "
        f"{ {k: int(v) for k, v in example.items()} }"
    )
