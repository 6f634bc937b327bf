"""resilience checker: exercise 2: the pieces of a saved ZeRO flat buffer a new rank needs."""

from __future__ import annotations

import random
from collections.abc import Callable

from ...course.check import call_learner, fail, passed


def _cases() -> list[tuple[int, int, int]]:
    """(numel, saved_world, new_world): the lesson's 4 → 2 and 2 → 3, fewer elements than
    ranks, exact multiples, and a seeded sample of sizes up to 50 over worlds up to 8."""
    rng = random.Random(18)
    out = [(10, 4, 2), (10, 2, 3), (3, 4, 2), (2, 2, 5), (12, 3, 4), (12, 4, 3), (7, 1, 3)]
    for _ in range(10):
        out.append((rng.randint(1, 50), rng.randint(1, 8), rng.randint(1, 8)))
    return out


RESHARD_CASES = _cases()

HINTS = {
    r"ZeroDivisionError": "a division by zero: with floor division numel // world is 0 when "
    "there are fewer elements than ranks; a shard is ceil(numel / world) elements",
    r"TypeError": "return a list of (saved_rank, start, stop) tuples of ints",
}


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _pieces(
    numel,
    d,
    d2,
    r2,
    chunk=_ceil,
    swap=False,
    local=True,
    stop_shift=0,
    pad=False,
    first_only=False,
    reverse=False,
    rank_shift=0,
    modulo_new=False,
) -> list:
    """The right answer, or one reading of it with a named part changed."""
    if swap:
        d, d2 = d2, d
    c, c2 = max(chunk(numel, d), 1), max(chunk(numel, d2), 1)
    r2 = (r2 + rank_shift) % d2
    lo, hi = r2 * c2, (r2 + 1) * c2 if pad else min((r2 + 1) * c2, numel)
    out = []
    for r in range(d):
        a, b = max(lo, r * c), min(hi, (r + 1) * c if pad else min((r + 1) * c, numel))
        if a < b and modulo_new:
            out.append((r, a % c2, a % c2 + b - a))
        elif a < b:
            base = r * c if local else 0
            out.append((r, a - base, b - base + stop_shift))
    out = out[:1] if first_only else out
    return out[::-1] if reverse else out


def reshard_reference(numel: int, saved_world: int, new_world: int, new_rank: int) -> list:
    """The pieces (saved rank, start, stop) rank `new_rank` of `new_world` reads."""
    return _pieces(numel, saved_world, new_world, new_rank)


READINGS = {
    "a shard of numel // world elements (floor): a shard is ceil(numel / world), the last "
    "padded": dict(chunk=lambda a, b: a // b),
    "a shard of round(numel / world) elements: a shard is ceil(numel / world) (rounding "
    "down would leave the last elements in no shard)": dict(chunk=lambda a, b: round(a / b)),
    "the worlds swapped: the saved shards are ceil(numel / saved_world), the new ones "
    "ceil(numel / new_world)": dict(swap=True),
    "offsets in the whole flat buffer: start and stop are inside the saved rank's shard "
    "(subtract saved_rank · its shard size)": dict(local=False),
    "offsets taken modulo the new shard size c': they are inside the saved rank's shard, "
    "whose size is c = ceil(numel / saved_world) (subtract saved_rank · c)": dict(modulo_new=True),
    "each stop one short: stop is exclusive, as in a Python slice": dict(stop_shift=-1),
    "each stop one past the end: stop is exclusive, as in a Python slice": dict(stop_shift=1),
    "padding read: a checkpoint holds no padding; stop at numel": dict(pad=True),
    "only the first overlapping saved shard: a new shard can span several saved ones": dict(
        first_only=True
    ),
    "the pieces in reverse order: list them in the flat buffer's order": dict(reverse=True),
    "the next rank's pieces: rank r of the new world holds [r·c', (r+1)·c')": dict(rank_shift=1),
    "the previous rank's pieces: rank r of the new world holds [r·c', (r+1)·c')": dict(
        rank_shift=-1
    ),
}


def _shape(got) -> str | None:
    if not isinstance(got, list | tuple):
        return f"returned {type(got).__name__}: return a list of (saved_rank, start, stop)"
    for p in got:
        if not isinstance(p, list | tuple) or len(p) != 3:
            return f"returned a piece {p!r}: each piece is (saved_rank, start, stop)"
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in p):
            return f"returned a piece {p!r}: saved_rank, start and stop are ints"
    return None


def _clean(got) -> list:
    return [tuple(p) for p in got if p[1] != p[2]]  # an empty piece reads nothing: allowed


def _diagnose(numel: int, d: int, d2: int, r2: int, got, reading: str | None) -> str | None:
    what = f"reshard_flat(numel={numel}, saved_world={d}, new_world={d2}, new_rank={r2})"
    problem = _shape(got)
    if problem:
        return f"{what} {problem}"
    got, want = _clean(got), reshard_reference(numel, d, d2, r2)
    if reading is not None:
        return f"{what} returned {got}: {reading}. Want {want}"
    c = _ceil(numel, d)
    for r, a, b in got:
        size = max(0, min((r + 1) * c, numel) - r * c) if 0 <= r < d else None
        if size is None:
            return f"{what} returned {got}: saved rank {r} does not exist (0..{d - 1}). Want {want}"
        if not 0 <= a < b <= size:
            return (
                f"{what} returned {got}: ({r}, {a}, {b}) is outside saved rank {r}'s shard "
                f"of {size} elements (start < stop ≤ {size}). Want {want}"
            )
    return (
        f"{what} returned {got}, want {want}: the saved shards hold [r·{c}, (r+1)·{c}) of "
        f"the {numel} elements, the new rank [{r2}·c', ({r2}+1)·c') with c' = "
        f"ceil({numel}/{d2}); read each overlap, offsets inside the saved shard"
    )


def _consistent(got: dict) -> str | None:
    """The reading that gives the learner's answer on every case it got wrong, as a message
    on the first; with none, the first wrong case and the rule, no guessed cause."""
    wrong = [k for k, v in got.items() if _shape(v) or _clean(v) != reshard_reference(*k)]
    if not wrong:
        return None
    first = wrong[0]
    best = next(
        (
            reading
            for reading, flags in READINGS.items()
            if all(
                not _shape(got[k]) and _clean(got[k]) == _clean(_pieces(*k, **flags)) for k in wrong
            )
        ),
        None,
    )
    return _diagnose(*first, got[first], best)


def check_reshard_flat(reshard_flat: Callable) -> None:
    """Compare `reshard_flat(numel, saved_world, new_world, new_rank)` on every new rank."""
    got = {}
    for numel, d, d2 in RESHARD_CASES:
        for r2 in range(d2):
            what = f"reshard_flat(numel={numel}, saved_world={d}, new_world={d2}, new_rank={r2})"
            got[(numel, d, d2, r2)] = call_learner(
                reshard_flat, numel, d, d2, r2, hints=HINTS, what=what
            )
    problem = _consistent(got)
    if problem:
        fail(problem)
    n = sum(d2 for _, _, d2 in RESHARD_CASES)
    passed(
        f"the pieces of {len(RESHARD_CASES)} saved flat buffers for {n} new ranks "
        "(fewer elements than ranks, multiples and not): each new shard read whole, "
        "nothing twice, no padding"
    )
