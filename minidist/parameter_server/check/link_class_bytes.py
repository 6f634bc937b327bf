"""Checker of exercise 2 of lesson 12: a two-level all-reduce's bytes per link class,
`link_class_bytes(numel, inner_size, outer_size, element_size)`, against
`minidist.network.theory.two_level_bytes` and the ledger of a real 2×2 torus all-reduce."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from ... import comm
from ...course.check import fail, passed, run_on_world
from ...network import Mesh2D, bytes_by_link_class, torus_all_reduce
from ...network import theory as net_theory
from ...pipeline.check_call import learner_call

# -- exercise 2: a two-level all-reduce's bytes per link class --------------------------------

MESHES = [(i, o) for i in (1, 2, 4, 8) for o in (1, 2, 4, 16)]
MESH_NUMEL = 4096  # a multiple of every I·O above
REAL_NUMEL = 1024  # the 2×2 mesh's tensor: a multiple of 4
ELEMENT_SIZES = (4, 2)  # float32, and bf16: element_size varies too
HINTS = {
    "ZeroDivisionError": "a division by I - 1 or O - 1: a group of one rank sends nothing, "
    "(n-1)/n·M = 0",
    "TypeError": "link_class_bytes(numel, inner_size, outer_size, element_size): four ints",
}


def _ring(k: float, n: int, m: float) -> float:
    return k * (n - 1) / n * m


# Per link class, (formula of (I, O, M bytes, numel, element size), message): the first that
# matches the learner's answer on every mesh names the mistake.
INNER = [
    (
        lambda i, o, m, n, e: 2 * ((i - 1) // i) * m,
        "0 on every mesh: the inner reduce-scatter and all-gather are left out, or (I-1)//I, "
        "an integer division, made them 0; they are 2(I-1)/I·M.",
    ),
    (
        lambda i, o, m, n, e: _ring(3, i, m),
        "you counted the all-gather twice, 3(I-1)/I·M. The inner group runs one reduce-scatter, "
        "(I-1)/I·M, and one all-gather, (I-1)/I·M: 2(I-1)/I·M.",
    ),
    (
        lambda i, o, m, n, e: _ring(1, i, m),
        "off by 2x: they carry the reduce-scatter and the all-gather, (I-1)/I·M each, so "
        "2(I-1)/I·M; you counted one of them.",
    ),
    (
        lambda i, o, m, n, e: _ring(2, o, m),
        "the inner and outer group sizes are swapped: the I ranks of the inner group share the "
        "inner links (reduce-scatter and all-gather, 2(I-1)/I·M).",
    ),
    (
        lambda i, o, m, n, e: 2 * m,
        "you counted the payload, 2·M: on a ring each rank sends (I-1)/I of the tensor in a "
        "reduce-scatter and again in the all-gather, 2(I-1)/I·M.",
    ),
    (lambda i, o, m, n, e: _ring(2, i, n), "elements, not bytes: multiply by element_size."),
    (
        lambda i, o, m, n, e: _ring(2, i, 4 * n),
        "you assumed 4-byte elements: use element_size (2 for bf16).",
    ),
    (lambda i, o, m, n, e: _ring(2, i, 8 * m), "bits, not bytes: drop the factor 8."),
    (
        lambda i, o, m, n, e: _ring(2, i, m / i),
        "the inner collectives work on the whole tensor (M); only the outer all-reduce works on "
        "the 1/I chunk.",
    ),
    (
        lambda i, o, m, n, e: _ring(2, i, m) + _ring(2, o, m / i),
        "you added the outer bytes to the inner ones (the same as a flat all-reduce over all "
        "I·O ranks, 2(IO-1)/IO·M): each link class counts its own collectives, the inner "
        "2(I-1)/I·M.",
    ),
]
OUTER = [
    (
        lambda i, o, m, n, e: _ring(2, o, m / (i * o)),
        "the chunk each rank all-reduces over the outer group is 1/I of the tensor; you divided "
        "by I·O: 2(O-1)/O·M/I.",
    ),
    (
        lambda i, o, m, n, e: 2 * ((o - 1) // o) * m / i,
        "0 on every mesh: the outer all-reduce is left out, or (O-1)//O, an integer division, "
        "made it 0; it is 2(O-1)/O·M/I.",
    ),
    (
        lambda i, o, m, n, e: _ring(2, o, m),
        "you counted an all-reduce of the whole tensor, 2(O-1)/O·M. After the inner "
        "reduce-scatter each rank holds one chunk of 1/I of the tensor, and only that chunk is "
        "all-reduced across the outer group: 2(O-1)/O·M/I.",
    ),
    (
        lambda i, o, m, n, e: _ring(2, i, m / o),
        "the inner and outer group sizes are swapped: the O ranks of the outer group all-reduce "
        "the 1/I chunk, 2(O-1)/O·M/I.",
    ),
    (
        lambda i, o, m, n, e: _ring(2, o, m / o),
        "the chunk each rank holds after the inner reduce-scatter is 1/I of the tensor (the I "
        "ranks of the inner group split it), not 1/O: 2(O-1)/O·M/I.",
    ),
    (
        lambda i, o, m, n, e: _ring(1, o, m / i),
        "the outer step is an all-reduce, a reduce-scatter plus an all-gather of the chunk: "
        "2(O-1)/O·M/I; you counted half of it.",
    ),
    (
        lambda i, o, m, n, e: 2 * m / i,
        "you counted the payload, 2·M/I: on a ring each rank sends 2(O-1)/O of the chunk in "
        "an all-reduce.",
    ),
    (lambda i, o, m, n, e: _ring(2, o, n / i), "elements, not bytes: multiply by element_size."),
    (
        lambda i, o, m, n, e: _ring(2, o, 4 * n / i),
        "you assumed 4-byte elements: use element_size (2 for bf16).",
    ),
    (lambda i, o, m, n, e: _ring(2, o, 8 * m / i), "bits, not bytes: drop the factor 8."),
    (
        lambda i, o, m, n, e: _ring(2, i, m) + _ring(2, o, m / i),
        "you added the inner bytes to the outer ones: each link class counts its own collectives.",
    ),
]


def _answers(fn: Callable) -> list | str:
    out = []
    for i, o in MESHES:
        for e in ELEMENT_SIZES:
            call = f"link_class_bytes({MESH_NUMEL}, {i}, {o}, {e})"
            got = learner_call(fn, MESH_NUMEL, i, o, e, call=call, hints=HINTS)
            if not isinstance(got, dict) or set(got) != {"inner", "outer"}:
                return f'{call} returned {got!r}; return {{"inner": bytes, "outer": bytes}}.'
            right = net_theory.two_level_bytes(MESH_NUMEL, i, o, e)
            out.append((i, o, e, {k: float(v) for k, v in got.items()}, right))
    return out


def _diagnose_bytes(fn: Callable) -> str | None:
    """Each wrong link class named by the formula that matches it on every mesh."""
    answers = _answers(fn)
    if isinstance(answers, str):
        return answers
    close = lambda a, b: abs(a - b) <= 1e-9 * max(1.0, abs(b))
    keys = [k for k in ("inner", "outer") if any(not close(g[k], r[k]) for *_, g, r in answers)]
    if not keys:
        return None
    found = []
    for key, family in (("inner", INNER), ("outer", OUTER)):
        if key not in keys:
            continue
        for formula, message in family:
            if all(
                close(g[key], formula(i, o, MESH_NUMEL * e, MESH_NUMEL, e))
                for i, o, e, g, _ in answers
            ):
                found.append(f"the {key} links: {message}")
                break
        else:
            wrong = [(i, o, e, g, r) for i, o, e, g, r in answers if not close(g[key], r[key])]
            i, o, e, g, r = wrong[0]
            found.append(
                f"the {key} links differ from the ring model on {len(wrong)} of {len(answers)} "
                f"meshes, e.g. I = {i}, O = {o}, {e}-byte elements: you said {g[key]:g} B, "
                f"the ring model {r[key]:g} B ("
                + ("inner: 2(I-1)/I·M)." if key == "inner" else "outer: 2(O-1)/O·M/I).")
            )
    i, o, e, g, r = next(a for a in answers if any(not close(a[3][k], a[4][k]) for k in keys))
    example = (
        f"[e.g. I = {i}, O = {o}, {MESH_NUMEL} elements of {e} bytes: you said "
        f"{ {k: g[k] for k in keys} }, the ring model { {k: r[k] for k in keys} }]"
    )
    return " ".join(found) + f" {example}"


def _torus_ledger_on_rank() -> dict[str, dict[str, float]]:
    mesh = Mesh2D(2, 2)
    out = {}
    for inner in ("row", "column"):
        x = torch.ones(REAL_NUMEL, device="cpu") * (dist.get_rank() + 1)
        with comm.record() as ledger:
            torus_all_reduce(x, mesh, inner=inner)
        assert torch.equal(x, torch.full_like(x, 10.0))  # 1 + 2 + 3 + 4
        out[inner] = bytes_by_link_class(ledger, mesh)
    return out


def check_link_class_bytes(link_class_bytes: Callable) -> None:
    """`link_class_bytes(numel, inner_size, outer_size, element_size)` against the formula
    on a grid of meshes, then against the ledger of a real 2×2 torus all-reduce."""
    problem = _diagnose_bytes(link_class_bytes)
    if problem:
        fail(problem)
    ledgers = run_on_world(_torus_ledger_on_rank, 4)
    yours = link_class_bytes(REAL_NUMEL, 2, 2, 4)
    for rank, by_inner in enumerate(ledgers):
        for inner, sent in by_inner.items():
            outer = "column" if inner == "row" else "row"
            if sent[inner] != yours["inner"] or sent[outer] != yours["outer"]:  # unreachable
                fail(f"rank {rank}, {inner}-inner: the ledger says {sent}, you said {yours}")
    b = link_class_bytes(MESH_NUMEL, 8, 4, 4)
    passed(
        f"link_class_bytes matches the ring model on {len(MESHES)} meshes (4- and 2-byte "
        f"elements) and the ledger of a "
        f"real 2x2 torus all-reduce of {REAL_NUMEL} float32 (inner {yours['inner']:g} B, "
        f"outer {yours['outer']:g} B per rank); e.g. I = 8, O = 4, {MESH_NUMEL} float32: "
        f"inner {b['inner']:g} B, outer {b['outer']:g} B"
    )
