"""megatron checker: exercise 3: the group layout (pure)."""

from __future__ import annotations

from collections.abc import Callable

from ...course.check import fail, passed
from ..layout import parallel_groups
from ._shared import _and

GROUP_CASES = [(16, 2, 4), (8, 2, 2), (24, 2, 3), (12, 3, 2)]
GROUP_KINDS = ("tp", "pp", "dp")
GROUP_RULES = {
    "tp": "TP groups are blocks of t consecutive ranks (one node: TP all-reduces every layer)",
    "pp": "pipeline groups take every (n/p)-th rank: rank i, i + n/p, i + 2n/p, ...",
    "dp": (
        "DP groups sit inside one stage's block of n/p consecutive ranks and take every t-th "
        "rank of it: the ranks that hold the same tensor-parallel slice of the same stage"
    ),
}


def _normal(groups) -> list[list[int]] | None:
    try:
        return sorted(sorted(int(r) for r in g) for g in groups)
    except (TypeError, ValueError):
        return None


def _contiguous(world: int, size: int) -> list[list[int]]:
    return [list(range(i, i + size)) for i in range(0, world, size)]


def _diagnose_groups(got, world: int, tp: int, pp: int) -> str | None:
    where = f"my_parallel_groups({world}, tp={tp}, pp={pp})"
    dp = world // (tp * pp)
    if not isinstance(got, dict) or not all(k in got for k in GROUP_KINDS):
        keys = sorted(got) if isinstance(got, dict) else type(got).__name__
        return f"{where} returned {keys}; return a dict with the keys 'tp', 'pp' and 'dp'."
    want = parallel_groups(world, tp, pp)
    norm = {k: _normal(got[k]) for k in GROUP_KINDS}
    for kind in GROUP_KINDS:
        if norm[kind] is None:
            return f"{where}['{kind}'] is not a list of lists of ranks."
        if norm[kind] == _normal(want[kind]):
            continue
        swapped = parallel_groups(world, pp, tp) if world % (tp * pp) == 0 else None
        if swapped and all(norm[k] == _normal(swapped[k]) for k in GROUP_KINDS) and tp != pp:
            return (
                f"{where}: these are the groups of tp={pp}, pp={tp}: tp and pp are swapped "
                f"(your TP groups have {pp} ranks, they need t = {tp})."
            )
        want_size = {"tp": tp, "pp": pp, "dp": dp}[kind]
        got_sizes = {len(g) for g in norm[kind]}
        if len(got_sizes) == 1 and abs(got_sizes.pop() - want_size) == 1:
            mine = norm[kind][0]
            return (
                f"{where}['{kind}']: your groups have {len(mine)} ranks (e.g. {mine}), one "
                f"{'short of' if len(mine) < want_size else 'more than'} {want_size}: an "
                "off-by-one in a range (its end is exclusive: range(i, i + t) holds t ranks). "
                f"{GROUP_RULES[kind]}: rank 0's is {_normal(want[kind])[0]}."
            )
        flat = sorted(r for g in norm[kind] for r in g)
        if flat != list(range(world)):
            repeated = sorted({r for r in flat if flat.count(r) > 1})
            missing = sorted(set(range(world)) - set(flat))
            return (
                f"{where}['{kind}']: every rank must be in exactly one {kind} group; "
                + (f"ranks {repeated} appear more than once" if repeated else "")
                + ("; " if repeated and missing else "")
                + (f"ranks {missing} are in none" if missing else "")
                + "."
            )
        per_stage = world // pp
        if (
            kind == "tp"
            and tp > 1
            and norm[kind]
            == _normal([list(range(i, world, world // tp)) for i in range(world // tp)])
        ):
            return (
                f"{where}: your TP groups take every {world // tp}-th rank, e.g. "
                f"{norm[kind][0]}: they span nodes, and TP all-reduces activations in every "
                f"layer, forward and backward, over the slowest links. {GROUP_RULES['tp']}: "
                f"rank 0's is {_normal(want['tp'])[0]}."
            )
        if kind == "dp" and pp > 1:
            spans = next((g for g in norm[kind] if len({r // per_stage for r in g}) > 1), None)
            if spans is not None:
                stages = sorted({r // per_stage for r in spans})
                return (
                    f"{where}: your DP group {spans} spans pipeline stages {stages} (stage s is "
                    f"ranks [s·{per_stage}, (s+1)·{per_stage})): those ranks hold different "
                    f"layers, whose gradients must not be averaged. {GROUP_RULES['dp']}: rank "
                    f"0's is {_normal(want['dp'])[0]}."
                )
        size = {"tp": tp, "pp": pp, "dp": dp}[kind]
        sizes = sorted({len(g) for g in norm[kind]})
        if sizes != [size]:
            return (
                f"{where}['{kind}'] has groups of {sizes} ranks; with t={tp}, p={pp}, "
                f"d = n/(t·p) = {dp}, each {kind} group has {size}: {GROUP_RULES[kind]}."
            )
        if kind == "dp" and norm[kind] == _contiguous(world, dp):
            same_as_tp = " (here the TP groups themselves)" if dp == tp else ""
            return (
                f"{where}: your DP groups are blocks of {dp} consecutive ranks{same_as_tp}, "
                f"e.g. {norm[kind][0]}. Consecutive ranks are one TP group: they hold "
                "DIFFERENT slices of the layers, so averaging their gradients mixes slices. "
                f"{GROUP_RULES['dp']}: rank 0's DP group is {_normal(want['dp'])[0]}."
            )
        if kind == "pp" and norm[kind] == _contiguous(world, pp):
            return (
                f"{where}: your pipeline groups are blocks of {pp} consecutive ranks, e.g. "
                f"{norm[kind][0]}: consecutive ranks are one TP group, one node, one stage. A "
                f"pipeline passes activations from stage to stage, and stage s is the block "
                f"of ranks [s·n/p, (s+1)·n/p): {GROUP_RULES['pp']}, rank 0's is "
                f"{_normal(want['pp'])[0]}."
            )
        mine = next(g for g in norm[kind] if 0 in g)
        return (
            f"{where}['{kind}']: rank 0's group is {mine}, Megatron-LM's is "
            f"{next(g for g in _normal(want[kind]) if 0 in g)}: {GROUP_RULES[kind]}."
        )
    return None


def check_parallel_groups(my_parallel_groups: Callable) -> None:
    """`my_parallel_groups(world_size, tp, pp)` against `parallel_groups`, as a pure function."""
    for world, tp, pp in GROUP_CASES:
        got = my_parallel_groups(world, tp, pp)
        problem = _diagnose_groups(got, world, tp, pp)
        if problem:
            fail(problem)
    cases = _and(f"({w}, t={t}, p={p})" for w, t, p in GROUP_CASES)
    passed(f"my_parallel_groups gives Megatron-LM's tp, pp and dp groups for {cases}")
