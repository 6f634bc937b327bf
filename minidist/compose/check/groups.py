"""Lesson 17's checker, exercise 1: every group kind's rank lists, built from the sizes.

The learner's `build_groups(pp, dp_replicate, dp_shard, cp, tp, ep)` is compared with
`compose.dims.grid_groups` on sampled layouts (1 to 32 ranks, sizes of 1, 3 and 5 included),
as sets of groups (their order and the order inside a group do not matter). Every layout is
asked first; a catalogued mistake is named only when it gives the learner's groups on every
layout the learner got wrong: ranks packed with bit shifts or counted from 1; a misplaced
axis (tp not innermost, pp not outermost, dp_shard and dp_replicate swapped, cp outside
dp_shard, read from the strides of the learner's groups); a composite kind missing or adding
an axis (ZeRO's shard group without cp or dp_shard or with dp_replicate, the dense copies
without dp_replicate or cp or with tp); ep drawn across dp_replicate, strided, cut with cp
outermost or from dp_shard alone, or of the wrong size. Otherwise the message shows the
first wrong layout's group of a rank, the learner's and the right one. Groups of one rank
dropped and ranks missing or twice are told as they are.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from ...course.check import fail, passed
from ...course.guard import guarded
from ..dims import AXES, grid_groups
from ..dims import KINDS as KIND_AXES
from ._shared import GROUP_CASES, _and, as_ranks, call, dims_of

KINDS = ("tp", "cp", "dp_shard", "dp_replicate", "pp", "dp_shard_cp", "dp_cp", "ep")
_EP = (
    "an ep group is a block of e consecutive ranks of a dp_shard_cp group, in that "
    "group's order (dp_shard outer, cp inner)"
)
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
        why = (
            "the grid is (pp, dp_replicate, dp_shard, cp, tp), tp varying fastest: an axis's "
            "stride is the product of the sizes of the axes inside it"
        )
    return f"{why}. Your groups: {said}"


def _bits(size: int) -> int:
    return max(size - 1, 0).bit_length()


def _grid(
    sizes: dict,
    order=AXES,
    shard_cp=("dp_shard", "cp"),
    dense=("dp_replicate", "dp_shard", "cp"),
    ep_from=("dp_shard", "cp"),
    ep_strided=False,
    shifts=False,
    base=0,
) -> dict[str, set[frozenset[int]]]:
    """Every kind's groups as a learner might build them: the axes nested in `order`
    (outermost first), packed with multiplications (or bit shifts), counted from `base`;
    the shard group and the dense copies over the given axes; ep cut into blocks of e (or
    strided) from the groups moving along `ep_from` (in that order, outermost first)."""

    def rank(coord: dict) -> int:
        r = 0
        for a in order:
            r = (r << _bits(sizes[a]) | coord[a]) if shifts else r * sizes[a] + coord[a]
        return r + base

    def groups(moving) -> list[list[int]]:
        rest = [a for a in AXES if a not in moving]
        out = []
        for fixed in itertools.product(*(range(sizes[a]) for a in rest)):
            c = dict(zip(rest, fixed))
            moves = itertools.product(*(range(sizes[a]) for a in moving))
            out.append([rank({**c, **dict(zip(moving, m))}) for m in moves])
        return out

    out = {a: groups((a,)) for a in AXES}
    out["dp_shard_cp"], out["dp_cp"] = groups(shard_cp), groups(dense)
    e = sizes["ep"]
    if ep_strided:
        out["ep"] = [g[i :: len(g) // e] for g in groups(ep_from) for i in range(len(g) // e)]
    else:
        out["ep"] = [g[i : i + e] for g in groups(ep_from) for i in range(0, len(g), e)]
    return {k: {frozenset(g) for g in v} for k, v in out.items()}


# A catalogued mistake: (what to say, how that learner builds the groups). One is named only
# when it gives the learner's groups on every layout the learner got wrong.
WHOLE = [
    (
        "ranks packed with bit shifts (each axis given ⌈log2 size⌉ bits): right only when every "
        "size is a power of two. A rank is mixed-radix, the sizes as multipliers: rank = "
        "(((i_pp·dp_replicate + i_dr)·dp_shard + i_ds)·cp + i_cp)·tp + i_tp",
        dict(shifts=True),
    ),
    (
        "ranks counted from 1: ranks [0] are in none; ranks run from 0 to the world size minus 1",
        dict(base=1),
    ),
]
COMPOSITE = {
    "dp_shard_cp": [
        (
            "dp_shard_cp forgot cp: ZeRO shards over dp_shard × cp, the ranks that hold the same "
            "weights (the cp ranks hold other tokens of the same sequences)",
            dict(shard_cp=("dp_shard",)),
        ),
        (
            "dp_shard_cp includes dp_replicate: each HSDP replica holds a whole sharded copy, so "
            "the shard group is dp_shard × cp only",
            dict(shard_cp=KIND_AXES["dp_cp"]),
        ),
        ("dp_shard_cp forgot dp_shard: it is every rank of dp_shard × cp", dict(shard_cp=("cp",))),
    ],
    "dp_cp": [
        (
            "dp_cp forgot dp_replicate: HSDP's replicas hold a copy of every dense weight too, so "
            "dp_cp is dp_replicate × dp_shard × cp",
            dict(dense=("dp_shard", "cp")),
        ),
        (
            "dp_cp forgot cp: the cp ranks hold the same weights (and other tokens), so dp_cp is "
            "dp_replicate × dp_shard × cp",
            dict(dense=("dp_replicate", "dp_shard")),
        ),
        (
            "dp_cp includes tp: the tp ranks hold different pieces of a weight",
            dict(dense=("dp_replicate", "dp_shard", "cp", "tp")),
        ),
    ],
    "ep": [
        (
            f"ep is drawn across dp_replicate: each HSDP replica holds every expert, so {_EP}",
            dict(ep_from=KIND_AXES["dp_cp"]),
        ),
        (
            f"ep is drawn across dp_replicate: each HSDP replica holds every expert, so {_EP}",
            dict(ep_from=KIND_AXES["dp_cp"], ep_strided=True),
        ),
        (
            f"ep groups are strided: {_EP} (the ranks e apart hold the same experts: ep_shard)",
            dict(ep_strided=True),
        ),
        (f"ep is cut with cp outermost: {_EP}", dict(ep_from=("cp", "dp_shard"))),
        (
            f"ep is cut from dp_shard alone: {_EP}; the experts are spread over dp_shard × cp",
            dict(ep_from=("dp_shard",)),
        ),
    ],
}


def _wrong(answers: list, kinds) -> list:
    return [(sizes, got) for sizes, got, want in answers if any(got[k] != want[k] for k in kinds)]


def _reading(wrong: list, catalogue, kinds) -> str | None:
    """The first catalogued mistake that gives the learner's `kinds` on every wrong layout."""
    for text, how in catalogue:
        if all(all(got[k] == _grid(sizes, **how)[k] for k in kinds) for sizes, got in wrong):
            return text
    return None


def _coverage(sizes: dict, got: dict) -> str | None:
    """Ranks missing, twice, or outside 0 … N-1 in some kind (a fact, not a guess)."""
    n = dims_of(sizes).world_size
    for kind in KINDS:
        seen = sorted(r for g in got[kind] for r in g)
        if seen != list(range(n)) or sum(len(g) for g in got[kind]) != n:
            lost = sorted(set(range(n)) - set(seen))
            twice = sorted({r for r in seen if seen.count(r) > 1})
            return (
                f"every rank 0 … {n - 1} must be in exactly one {kind} group; "
                + (f"ranks {lost} are in none" if lost else "")
                + ("; " if lost and twice else "")
                + (f"ranks {twice} are in several" if twice else "")
                + (f" (a rank outside 0 … {n - 1})" if not lost and not twice else "")
            )
    return None


def _counterexample(sizes: dict, got: dict, want: dict, kinds) -> str:
    """The group of the first rank of each wrong kind, the learner's and the right one."""
    out = []
    for k in kinds:
        if got[k] != want[k]:
            r = min(min(g) for g in want[k])
            mine = next((g for g in got[k] if r in g), frozenset())
            right = next(g for g in want[k] if r in g)
            out.append(f"{k}: the group of rank {r} is {sorted(mine)}, want {sorted(right)}")
    return "; ".join(out)


def _call_text(sizes: dict) -> str:
    return "build_groups(" + ", ".join(f"{a}={sizes[a]}" for a in (*AXES, "ep")) + ")"


def _diagnose(answers: list) -> str | None:
    """The first named mistake that explains every wrong layout, in the order: whole-grid
    slips, the axes' order, each composite kind; else the first wrong layout, as it is."""
    wrong = _wrong(answers, KINDS)
    if not wrong:
        return None
    text = _reading(wrong, WHOLE, KINDS)
    if text:
        return f"{_call_text(wrong[0][0])}: {text}"
    for sizes, got in wrong:
        problem = _coverage(sizes, got)
        if problem:
            return f"{_call_text(sizes)}: {problem}."
    axes = _wrong(answers, AXES)
    if axes:
        sizes, got = axes[0]
        orders = [dict(order=p) for p in itertools.permutations(AXES) if p != AXES]
        if _reading(axes, [("", how) for how in orders], AXES) is not None:
            mine = {a: [g for g in got[a]] for a in AXES}
            return f"{_call_text(sizes)}: {_order(mine, sizes)}."
        want = next(w for s, _, w in answers if s is sizes)
        return f"{_call_text(sizes)}: {_counterexample(sizes, got, want, AXES)}."
    for kind in ("dp_shard_cp", "dp_cp", "ep"):
        bad = _wrong(answers, (kind,))
        if not bad:
            continue
        sizes, got = bad[0]
        want = next(w for s, _, w in answers if s is sizes)
        text = _reading(bad, COMPOSITE[kind], (kind,))
        if text is None and kind == "ep" and any(len(g) != sizes["ep"] for g in got["ep"]):
            text = (
                f"an ep group has e = {sizes['ep']} ranks, yours have "
                f"{sorted({len(g) for g in got['ep']})}"
            )
        if text:
            yours, right = (sorted(sorted(g) for g in x[kind])[:4] for x in (got, want))
            return f"{_call_text(sizes)}: {text}. Yours: {yours}, want {right}."
        return f"{_call_text(sizes)}: {_counterexample(sizes, got, want, (kind,))}."
    return None


def _case(build_groups, sizes: dict) -> tuple[dict, dict]:
    """The learner's groups for one layout, as sets (or a failure naming their format)."""
    call_text = _call_text(sizes)
    out = call(build_groups, *(sizes[a] for a in AXES), sizes["ep"], what=call_text)
    if not isinstance(out, Mapping):
        fail(
            f"{call_text} returned a {type(out).__name__}; return a dict {{kind: list of rank "
            f"lists}} with the kinds {_and(KINDS)}."
        )
    missing = [k for k in KINDS if k not in out]
    if missing:
        fail(f"{call_text}: no {_and(missing)} in your dict; return every kind: {_and(KINDS)}.")
    want = grid_groups(dims_of(sizes))
    got = {}
    for kind in KINDS:
        groups = as_ranks(out[kind])
        if groups is None:
            fail(f"{call_text}: {kind} is not a list of rank lists ({out[kind]!r:.80}).")
        if not groups:
            size = len(want[kind][0])
            fail(
                f"{call_text}: {kind} has no groups. Every rank is in exactly one group of "
                f"each kind, even of one rank: with {kind} of size {size} that is "
                f"{len(want[kind])} groups of {size}."
            )
        got[kind] = groups
    return got, {k: {frozenset(g) for g in want[k]} for k in KINDS}


def check_build_groups(build_groups) -> None:
    """`build_groups(pp, dp_replicate, dp_shard, cp, tp, ep)` against `grid_groups`."""
    answers = []
    for sizes in GROUP_CASES:
        got, want = _case(build_groups, sizes)
        answers.append((sizes, {k: set(v) for k, v in got.items()}, want))
    problem = guarded(_diagnose, "", answers)
    if problem:
        fail(problem)
    if any(a[1] != a[2] for a in answers):
        fail(f"{_call_text(_wrong(answers, KINDS)[0][0])}: your groups differ from grid_groups.")
    worlds = sorted({dims_of(s).world_size for s in GROUP_CASES})
    passed(
        f"build_groups equals grid_groups for every kind ({_and(KINDS)}) on "
        f"{len(GROUP_CASES)} layouts of {_and(worlds)} ranks, sizes of 1, 3 and 5 included"
    )
