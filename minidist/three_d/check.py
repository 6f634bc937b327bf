"""Checkers for the exercises of lesson 10 (3D parallelism). Pure functions: no world.

1. `check_rank_of(rank_of)`: `rank_of(tp_rank, pp_rank, dp_rank, tp, pp, dp)` returns the
   global rank of a grid position in Megatron-LM's layout (Narayanan et al. 2021, section 3;
   `minidist.megatron.layout.parallel_groups`): tp groups are t consecutive ranks, a stage is
   a block of t·d ranks, dp groups take every t-th rank inside it. Compared with the groups
   of `parallel_groups` for several (t, p, d). Named mistakes: tp and dp swapped (dp
   neighbours), pipeline stages contiguous (a replica's stages next to each other), a rank
   outside the world, two positions on one rank.
2. `check_bytes_per_step(bytes_per_step)`: `bytes_per_step(stage, tp, pp, dp, trainable,
   **SIZES)` returns {"tp", "pp", "dp"}: bytes one rank of `stage` sends per step on each
   group kind. Compared with `theory.bytes_sent_per_step`. Named mistakes: the tp bytes on a
   ring of d (the dp group) instead of t, tp bytes added to dp, the tied embedding's
   all-reduce forgotten, the global batch where a replica trains on B/d, ZeRO-1's all-gather
   forgotten, ZeRO-1 counted as an all-reduce of the unpadded gradients.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import comm
from ..course.check import fail, passed
from ..megatron.layout import parallel_groups
from . import theory

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


def _diagnose_grid(rank_of: Callable, t: int, p: int, d: int) -> str | None:
    n, where = t * p * d, f"t = {t}, p = {p}, d = {d}"
    got = {}
    for pos in _positions(t, p, d):
        value = rank_of(*pos, t, p, d)
        if not isinstance(value, int) or isinstance(value, bool):
            return f"{where}: rank_of{(*pos, t, p, d)} returned {value!r}; return an int."
        got[pos] = value
    right = {pos: reference_rank(*pos, t, p, d) for pos in got}
    if got == right:
        return None
    if all(got[(i, j, k)] == j * t * d + i * d + k for i, j, k in got):
        return (
            f"{where}: tp and dp are swapped: your data-parallel replicas sit on neighbouring "
            "ranks and a tp group is every d-th rank. Megatron-LM puts the tp group on t "
            "consecutive ranks (one node, the fastest links: TP all-reduces every layer), so "
            "tp_rank is the fastest-moving index: rank = pp_rank·t·d + dp_rank·t + tp_rank."
        )
    if all(got[(i, j, k)] == k * t * p + j * t + i for i, j, k in got):
        return (
            f"{where}: your pipeline stages are contiguous (one replica's stages next to each "
            "other, replicas outermost). In Megatron-LM a stage is a block of n/p = t·d "
            "consecutive ranks and a pipeline group takes every (n/p)-th rank: stages span "
            "nodes, where only point-to-point activations travel. rank = pp_rank·t·d + "
            "dp_rank·t + tp_rank."
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
    pos = next(q for q in got if got[q] != right[q])
    return (
        f"{where}: rank_of{(*pos, t, p, d)} = {got[pos]}, but in parallel_groups that position "
        f"is rank {right[pos]} (tp groups {parallel_groups(n, t, p)['tp'][:2]}...)."
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
BYTE_CASES = ((2, 2, 2), (1, 2, 2), (2, 1, 3), (2, 4, 1), (2, 2, 3), (4, 2, 2))  # (t, p, d)
FROZEN = 32  # ln_f.bias, on the last stage


def _trainable(stage: int, t: int, p: int) -> int:
    s = SIZES
    return theory.trainable_per_rank(stage, p, s["layers"], s["hidden"], s["vocab"], s["seq"],
                                     t, FROZEN)  # fmt: skip


def _right(stage, t, p, d, trainable, batch=None) -> dict[str, float]:
    s = dict(SIZES, batch=batch or SIZES["batch"])
    b = s["batch"] // d
    return {
        "tp": theory.tp_bytes_sent_per_step(stage, p, s["layers"], b, s["seq"], s["hidden"], t),
        "pp": theory.pp_bytes_sent_per_step(stage, p, b, s["seq"], s["hidden"], s["vocab"], t),
        "dp": theory.dp_bytes_sent_per_step(trainable, d),
    }


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


def _diagnose_bytes(fn: Callable, stage: int, t: int, p: int, d: int) -> str | None:
    where = f"stage {stage} of t = {t}, p = {p}, d = {d}"
    trainable = _trainable(stage, t, p)
    got = fn(stage, t, p, d, trainable, **SIZES)
    if not isinstance(got, dict) or set(got) != {"tp", "pp", "dp"}:
        return f"{where}: return a dict with keys 'tp', 'pp', 'dp'; you returned {got!r}."
    right = _right(stage, t, p, d, trainable)
    wrong = [k for k in right if not _same(float(got[k]), right[k])]
    if not wrong:
        return None
    say = f"you said { ({k: round(float(got[k])) for k in wrong}) }, theory { ({k: round(right[k]) for k in wrong}) }"  # noqa: E501
    s = SIZES
    b = s["batch"] // d
    on_d = theory.tp_bytes_sent_per_step(stage, p, s["layers"], b, s["seq"], s["hidden"], d)
    if "tp" in wrong and t != d and _same(got["tp"], on_d):
        return (
            f"{where}: your tp bytes are those of a ring of d = {d} ranks: tensor parallelism's "
            f"all-reduces go over the tp group, t = {t} ranks, 2(t-1)/t of each. {say}"
        )
    if wrong == ["dp"] and _same(got["dp"], right["dp"] + right["tp"]):
        return (
            f"{where}: your dp bytes include the tp all-reduces: those go over the tp group; "
            f"the dp group carries only ZeRO-1's reduce-scatter and all-gather. {say}"
        )
    tied = comm.ring_bytes("all_reduce", theory.padded_vocab(s["vocab"], t) // t * s["hidden"]
                           * 4, 2) if p > 1 and stage in (0, p - 1) else 0  # fmt: skip
    if wrong == ["pp"] and tied and _same(got["pp"], right["pp"] - tied):
        return (
            f"{where}: the tied embedding's all-reduce is missing: the first and last stages "
            "each hold the embedding (the input and the output head) and all-reduce its "
            f"gradient, their vocabulary shard V/t·h, over the embedding group of 2. {say}"
        )
    whole = _right(stage, t, p, 1, trainable)
    if (
        d > 1
        and {"tp", "pp"} & set(wrong)
        and all(_same(float(got[k]), whole[k]) for k in ("tp", "pp") if k in wrong)
    ):
        return (
            f"{where}: your tp/pp bytes are for the global batch of {s['batch']}: each of the "
            f"d = {d} replicas trains on B/d = {b} sequences, so its activations are d "
            f"times smaller. {say}"
        )
    if wrong == ["dp"] and _same(got["dp"], right["dp"] / 2):
        return (
            f"{where}: ZeRO-1 sends twice that: the reduce-scatter of the gradients and the "
            f"all-gather of the updated parameters, (d-1)/d of the padded flat each. {say}"
        )
    if wrong == ["dp"] and _same(got["dp"], comm.ring_bytes("all_reduce", 4 * trainable, d)):
        return (
            f"{where}: an all-reduce of the {trainable} gradients moves almost the same bytes, "
            f"but ZeRO-1 reduce-scatters the flat padded to a multiple of d = {d} "
            f"({-(-trainable // d) * d} elements), then all-gathers it. {say}"
        )
    return f"{where}: {say}."


def check_bytes_per_step(bytes_per_step: Callable) -> None:
    """`bytes_per_step(stage, tp, pp, dp, trainable, **SIZES)` against `theory`."""
    for t, p, d in BYTE_CASES:
        for stage in range(p):
            problem = _diagnose_bytes(bytes_per_step, stage, t, p, d)
            if problem:
                fail(problem)
    example = bytes_per_step(0, 2, 2, 2, _trainable(0, 2, 2), **SIZES)
    passed(
        f"bytes_per_step matches theory.bytes_sent_per_step on every stage of "
        f"{len(BYTE_CASES)} layouts; e.g. stage 0 of t = p = d = 2: "
        f"{ {k: int(v) for k, v in example.items()} }"
    )
