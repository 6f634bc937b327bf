"""Lesson 17's checker, exercise 1: every group kind's rank lists, built from the sizes.

The learner's `build_groups(pp, dp_replicate, dp_shard, cp, tp, ep)` is compared with
`compose.dims.grid_groups` on sampled layouts (1 to 32 ranks, sizes of 1 included), as sets
of groups (their order and the order inside a group do not matter). A wrong answer is
named: a misplaced axis (tp not innermost, pp not outermost, dp_shard and dp_replicate
swapped, cp outside dp_shard) read from the strides of the learner's groups; a composite
kind missing or adding an axis (ZeRO's shard group without cp or with dp_replicate, the
dense copies without dp_replicate or cp); ep drawn across dp_replicate, strided instead of
consecutive, or of the wrong size; groups of one rank dropped; ranks twice or missing.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...course.check import fail, passed
from ...course.guard import guarded
from ..dims import AXES, coordinates, grid_groups
from ._shared import GROUP_CASES, _and, as_ranks, call, dims_of

KINDS = ("tp", "cp", "dp_shard", "dp_replicate", "pp", "dp_shard_cp", "dp_cp", "ep")
ORDER_WHY = {
    "tp": "tp must be innermost: a tp group is t consecutive ranks (stride 1), inside one "
    "node on the fastest links, because tensor parallelism moves activations in every layer",
    "pp": "pp must be outermost: a pipeline's ranks stride by N/p = {right}, so that each "
    "stage is a block of consecutive ranks; stages send the least (one activation per "
    "micro-batch, point to point) and may cross nodes",
    "dp_replicate": "dp_shard and dp_replicate are swapped: dp_replicate is outside dp_shard "
    "(HSDP's replicas all-reduce once per step, over the slowest links; the shard group, which "
    "reduce-scatters and all-gathers, sits inside it)",
    "cp": "cp sits inside dp_shard, just outside tp: ring attention passes K/V blocks every "
    "layer, the data dimensions move gradients once per step",
}


def _stride(groups: list[frozenset[int]], size: int) -> int | None:
    """The stride of the learner's group holding rank 0, when it is 0, s, 2s, ..."""
    g = sorted(next((g for g in groups if 0 in g), ()))
    if len(g) != size or size < 2:
        return None
    s = g[1] - g[0]
    return s if g == list(range(0, s * size, s)) else None


def _right_stride(sizes: dict, axis: str) -> int:
    out = 1
    for inner in AXES[AXES.index(axis) + 1 :]:
        out *= sizes[inner]
    return out


def _order(got: dict, sizes: dict) -> str | None:
    """Which axis the learner placed elsewhere, read from the strides of its groups."""
    n = 1
    for a in AXES:
        n *= sizes[a]
    strides = {a: _stride(got[a], sizes[a]) for a in AXES if sizes[a] > 1}
    wrong = [a for a, s in strides.items() if s is not None and s != _right_stride(sizes, a)]
    if not wrong:
        return None
    said = ", ".join(f"{a} strides by {strides[a]} (want {_right_stride(sizes, a)})" for a in wrong)
    s = strides
    if s.get("pp") == 1:
        why = ORDER_WHY["pp"].format(right=n // sizes["pp"])
    elif "tp" in wrong:
        why = ORDER_WHY["tp"]
    elif "pp" in wrong:
        why = ORDER_WHY["pp"].format(right=n // sizes["pp"])
    elif s.get("dp_replicate") and s.get("dp_shard") and s["dp_replicate"] < s["dp_shard"]:
        why = ORDER_WHY["dp_replicate"]
    elif s.get("cp") and s.get("dp_shard") and s["cp"] > s["dp_shard"]:
        why = ORDER_WHY["cp"]
    else:
        why = ("the grid is (pp, dp_replicate, dp_shard, cp, tp), tp varying fastest: an axis's "
               "stride is the product of the sizes of the axes inside it")  # fmt: skip
    return f"{why}. Your groups: {said}"


def _blocks(groups, size, strided=False):
    out = []
    for g in groups:
        g = list(g)
        k = len(g) // size if size else 0
        out += [g[i::k] for i in range(k)] if strided else [g[i : i + size] for i in
                                                              range(0, len(g), size)]  # fmt: skip
    return {frozenset(b) for b in out}


def _moving(dims, axes: tuple[str, ...]) -> set[frozenset[int]]:
    """The groups of ranks that differ along `axes` only."""
    out: dict[tuple, set[int]] = {}
    for r in range(dims.world_size):
        at = coordinates(dims, r)
        out.setdefault(tuple(at[a] for a in AXES if a not in axes), set()).add(r)
    return {frozenset(g) for g in out.values()}


def _composite(kind: str, got: set, want: dict, sizes: dict, dims) -> str | None:
    """Name a composite kind (dp_shard_cp, dp_cp, ep) that misses or adds an axis."""
    s = {k: {frozenset(g) for g in v} for k, v in want.items()}
    if kind == "dp_shard_cp":
        if got == s["dp_shard"]:
            return (
                "dp_shard_cp forgot cp: ZeRO shards over dp_shard × cp, the ranks that hold "
                "the same weights (the cp ranks hold other tokens of the same sequences)"
            )
        if got == s["dp_cp"]:
            return ("dp_shard_cp includes dp_replicate: each HSDP replica holds a whole sharded "
                    "copy, so the shard group is dp_shard × cp only")  # fmt: skip
        if got == s["cp"]:
            return "dp_shard_cp forgot dp_shard: it is every rank of dp_shard × cp"
    if kind == "dp_cp":
        if got == s["dp_shard_cp"]:
            return ("dp_cp forgot dp_replicate: HSDP's replicas hold a copy of every dense "
                    "weight too, so dp_cp is dp_replicate × dp_shard × cp")  # fmt: skip
        no_cp = _moving(dims, ("dp_replicate", "dp_shard"))
        if got == no_cp:
            return ("dp_cp forgot cp: the cp ranks hold the same weights (and other tokens), "
                    "so dp_cp is dp_replicate × dp_shard × cp")  # fmt: skip
        if got == s["stage"]:
            return "dp_cp includes tp: the tp ranks hold different pieces of a weight"
    if kind == "ep":
        e = dims.ep
        if got == _blocks(want["dp_cp"], e) or got == _blocks(want["dp_cp"], e, strided=True):
            return ("ep is drawn across dp_replicate: experts are placed over dp_shard × cp only "
                    "(each HSDP replica holds every expert), blocks of e ranks of a "
                    "dp_shard_cp group")  # fmt: skip
        if got == _blocks(want["dp_shard_cp"], e, strided=True):
            return (
                f"ep groups are strided: they are consecutive blocks of e = {e} ranks of a "
                "dp_shard_cp group (in its order); the ranks e apart hold the same experts"
            )
        if any(len(g) != e for g in got):
            return f"an ep group has e = {e} ranks, yours have {sorted({len(g) for g in got})}"
    return None


def _case(build_groups, sizes: dict) -> None:
    dims = dims_of(sizes)
    args = ", ".join(f"{a}={sizes[a]}" for a in (*AXES, "ep"))
    call_text = f"build_groups({args})"
    out = call(build_groups, *(sizes[a] for a in AXES), sizes["ep"], what=call_text)
    if not isinstance(out, Mapping):
        fail(f"{call_text} returned a {type(out).__name__}; return a dict {{kind: list of rank "
             f"lists}} with the kinds {_and(KINDS)}.")  # fmt: skip
    missing = [k for k in KINDS if k not in out]
    if missing:
        fail(f"{call_text}: no {_and(missing)} in your dict; return every kind: {_and(KINDS)}.")
    want = grid_groups(dims)
    n = dims.world_size
    got = {}
    for kind in KINDS:
        groups = as_ranks(out[kind])
        if groups is None:
            fail(f"{call_text}: {kind} is not a list of rank lists ({out[kind]!r:.80}).")
        got[kind] = groups
        seen = sorted(r for g in groups for r in g)
        if not groups and n >= 1:
            size = len(want[kind][0])
            fail(f"{call_text}: {kind} has no groups. Every rank is in exactly one group of "
                 f"each kind, even of one rank: with {kind} of size {size} that is "
                 f"{len(want[kind])} groups of {size}.")  # fmt: skip
        if seen != list(range(n)) or sum(len(g) for g in out[kind]) != n:
            lost = sorted(set(range(n)) - set(seen))
            twice = sorted({r for r in seen if seen.count(r) > 1})
            fail(
                f"{call_text}: every rank 0 … {n - 1} must be in exactly one {kind} group; "
                + (f"ranks {lost} are in none" if lost else "")
                + ("; " if lost and twice else "")
                + (f"ranks {twice} are in several" if twice else "")
                + (f" (a rank outside 0 … {n - 1})" if not lost and not twice else "")
                + "."
            )
    wrong = [k for k in KINDS if set(got[k]) != {frozenset(g) for g in want[k]}]
    if not wrong:
        return
    fallback = "; ".join(
        f"{k}: the group of rank {min(want[k][0])} is "
        f"{sorted(next((g for g in got[k] if min(want[k][0]) in g), set()))}, want "
        f"{sorted(want[k][0])}"
        for k in wrong
    )
    order = guarded(_order, fallback, got, sizes)
    if order:
        fail(f"{call_text}: {order}.")
    for kind in wrong:
        why = guarded(_composite, "", kind, set(got[kind]), want, sizes, dims)
        if why:
            fail(f"{call_text}: {why}. Yours: {sorted(sorted(g) for g in got[kind])[:4]}, "
                 f"want {sorted(sorted(g) for g in want[kind])[:4]}.")  # fmt: skip
    fail(f"{call_text}: {fallback}.")


def check_build_groups(build_groups) -> None:
    """`build_groups(pp, dp_replicate, dp_shard, cp, tp, ep)` against `grid_groups`."""
    for sizes in GROUP_CASES:
        _case(build_groups, sizes)
    worlds = sorted({dims_of(s).world_size for s in GROUP_CASES})
    passed(
        f"build_groups equals grid_groups for every kind ({_and(KINDS)}) on "
        f"{len(GROUP_CASES)} layouts of {_and(worlds)} ranks, sizes of 1 included"
    )
