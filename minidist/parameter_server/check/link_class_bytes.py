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

# -- exercise 2: a two-level all-reduce's bytes per link class --------------------------------

MESHES = [(i, o) for i in (1, 2, 4, 8) for o in (1, 2, 4, 16)]
MESH_NUMEL = 4096  # a multiple of every I·O above
REAL_NUMEL = 1024  # the 2×2 mesh's tensor: a multiple of 4


def _diagnose_bytes(fn: Callable) -> str | None:
    for i, o in MESHES:
        got = fn(MESH_NUMEL, i, o, 4)
        if not isinstance(got, dict) or set(got) != {"inner", "outer"}:
            return (
                f"link_class_bytes({MESH_NUMEL}, {i}, {o}, 4) returned {got!r}; return "
                '{"inner": bytes, "outer": bytes}.'
            )
    wrong = []
    for i, o in MESHES:
        got = fn(MESH_NUMEL, i, o, 4)
        right = net_theory.two_level_bytes(MESH_NUMEL, i, o, 4)
        if any(abs(got[k] - right[k]) > 1e-9 * max(1.0, right[k]) for k in right):
            wrong.append((i, o, got, right))
    if not wrong:
        return None
    size = MESH_NUMEL * 4

    def like(key: str, formula: Callable) -> bool:
        return all(abs(got[key] - formula(i, o)) < 1e-6 for i, o, got, _ in wrong)

    ring = lambda k, n: k * (n - 1) / n * size
    if like("outer", lambda i, o: ring(2, o)) and like("inner", lambda i, o: ring(2, i)):
        return (
            "the outer links: you counted an all-reduce of the whole tensor, 2(O-1)/O·M. After "
            "the inner reduce-scatter each rank holds one chunk of 1/I of the tensor, and only "
            "that chunk is all-reduced across the outer group: 2(O-1)/O·M/I."
        )
    if like("inner", lambda i, o: ring(3, i)):
        return (
            "the inner links: you counted the all-gather twice, 3(I-1)/I·M. The inner group "
            "runs one reduce-scatter, (I-1)/I·M, and one all-gather, (I-1)/I·M: 2(I-1)/I·M."
        )
    if like("inner", lambda i, o: ring(1, i)):
        outer_right = all(abs(got["outer"] - right["outer"]) < 1e-6 for _, _, got, right in wrong)
        return (
            "off by 2x on the inner links: they carry the reduce-scatter and the all-gather, "
            "(I-1)/I·M each, so 2(I-1)/I·M; you counted one of them, (I-1)/I·M."
            + ("" if outer_right else " Your outer links differ from 2(O-1)/O·M/I too.")
        )
    if like("inner", lambda i, o: ring(2, o)) or like("outer", lambda i, o: ring(2, i) / o):
        return (
            "the inner and outer group sizes are swapped: I ranks share the inner links "
            "(reduce-scatter and all-gather, 2(I-1)/I·M), O the outer ones (2(O-1)/O·M/I)."
        )
    i, o, got, right = wrong[0]
    return (
        f"e.g. I = {i}, O = {o}, {MESH_NUMEL} float32: you said {got}, the ring model gives "
        f"{right} ({len(wrong)} of {len(MESHES)} meshes differ)."
    )


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
        f"link_class_bytes matches the ring model on {len(MESHES)} meshes and the ledger of a "
        f"real 2x2 torus all-reduce of {REAL_NUMEL} float32 (inner {yours['inner']:g} B, "
        f"outer {yours['outer']:g} B per rank); e.g. I = 8, O = 4, {MESH_NUMEL} float32: "
        f"inner {b['inner']:g} B, outer {b['outer']:g} B"
    )
