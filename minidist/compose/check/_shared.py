"""What lesson 17's checkers share: the sampled layouts, the learner's function called so
that an exception becomes a message, and answers compared as sets of ranks."""

from __future__ import annotations

import random
import re

from ...course.failures import Failure, call_learner
from ..dims import AXES, ParallelDims


def _sample(world_sizes: tuple[int, ...], count: int, seed: int, ep: bool) -> list[dict]:
    """Layouts (sizes per axis, and ep) whose product is one of `world_sizes`, sizes of 1
    included, in a fixed random order (the same for every learner)."""
    rng, out = random.Random(seed), []
    for world in world_sizes:
        choices = []
        for pp in (1, 2, 4):
            for dr in (1, 2):
                for ds in (1, 2, 4):
                    for cp in (1, 2, 4):
                        tp = world // (pp * dr * ds * cp)
                        if tp in (1, 2, 4) and pp * dr * ds * cp * tp == world:
                            choices.append(dict(pp=pp, dp_replicate=dr, dp_shard=ds, cp=cp, tp=tp))
        for sizes in rng.sample(choices, min(count, len(choices))):
            eps = [e for e in (1, 2, 4) if (sizes["dp_shard"] * sizes["cp"]) % e == 0]
            out.append({**sizes, "ep": rng.choice(eps) if ep else 1})
    return out


# every axis of size 2 (32 ranks) first: a misplaced axis shows in its first case; sizes of
# 3 and 5 on every axis, so that ranks packed with bit shifts (right for powers of two) fail
GROUP_CASES = [
    dict(pp=2, dp_replicate=2, dp_shard=2, cp=2, tp=2, ep=2),
    *_sample((8, 16), 10, 17, ep=True),
    dict(pp=1, dp_replicate=3, dp_shard=2, cp=1, tp=1, ep=2),
    dict(pp=5, dp_replicate=1, dp_shard=1, cp=3, tp=1, ep=3),
    dict(pp=1, dp_replicate=1, dp_shard=3, cp=2, tp=3, ep=3),
    dict(pp=3, dp_replicate=1, dp_shard=5, cp=1, tp=2, ep=5),
    dict(pp=1, dp_replicate=2, dp_shard=6, cp=1, tp=1, ep=3),
    dict(pp=1, dp_replicate=1, dp_shard=1, cp=1, tp=1, ep=1),
]


def dims_of(sizes: dict, **extra) -> ParallelDims:
    return ParallelDims(**{a: sizes[a] for a in AXES}, ep=sizes.get("ep", 1), **extra)


def as_ranks(groups) -> list[frozenset[int]] | None:
    """A learner's list of rank lists as sets, or None when it is not one."""
    try:
        return [frozenset(int(r) for r in g) for g in groups]
    except (TypeError, ValueError):
        return None


HINTS = {
    r"KeyError": "a dictionary key that is not there: the axes are 'pp', 'dp_replicate', "
    "'dp_shard', 'cp' and 'tp'; a plan's keys are module-name patterns (match a module with "
    "fnmatchcase, do not look it up), and the group kinds are grid_groups(dims)'s keys",
    r"ZeroDivisionError": "a division by zero: every size is at least 1; a stride is the "
    "product of the sizes of the axes inside an axis (1 for tp, the innermost)",
    r"IndexError|out of range": "an index past the end: ranks run from 0 to the world size "
    "minus 1, the product of the five sizes",
    r"AttributeError": "the layout is a `ParallelDims`: its sizes are attributes "
    "(dims.tp, dims.sp, dims.ep, dims.pp, dims.chunks ...)",
}


def hints(failure: Failure) -> str | None:
    return next(
        (cause for pattern, cause in HINTS.items() if re.search(pattern, failure.text)), None
    )


def call(fn, *args, what: str):
    return call_learner(fn, *args, hints=hints, what=what)


def _and(items) -> str:
    names = [str(i) for i in items]
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]
