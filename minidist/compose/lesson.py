"""Lesson 17's entry in the harnesses: the "every parallelism at once" tour row.

The Llama-style model (GQA, rotary, SwiGLU, untied head) trained 3 Adam steps by
`parallelize` on a layout of the tour's world: dp_shard 2 · tp 2 (sp) · pp 2 on 8 ranks or
more, tp 2 (sp) · cp 2 on 4 (named in the row's label), against the same model in one
process (tolerances of tests/test_compose.py). Memory: rank 0's parameters, gradients,
float32 master chunk and Adam states; bytes: what rank 0 sent per step over its dp, tp, pp,
cp and ep groups, each beside `compose.theory`'s plan of rank 0.
"""

from __future__ import annotations

from pathlib import Path

from ..registry import TourRow, tour_row
from ..runtime import launch
from ..training import max_abs_diff
from . import bench, theory  # noqa: F401 (importing bench registers the `compose` bench)
from .dims import ParallelDims
from .fixture import build, reference, run_rank

LOSS_TOL, PARAM_TOL = 1e-5, 1e-3


def tour_layout(world_size: int) -> dict:
    if world_size >= 8:
        return dict(dp_shard=2, tp=2, sp=True, pp=2)
    if world_size >= 4:
        return dict(tp=2, sp=True, cp=2)
    raise ValueError(f"5D tour row: world_size={world_size} must be >= 4")


@tour_row("every parallelism at once", lesson=17)
def compose_row(world_size: int, out_dir: Path) -> TourRow:
    dims = tour_layout(world_size)
    n = 1
    for k in ("dp_shard", "tp", "pp", "cp"):
        n *= dims.get(k, 1)
    runs = launch(run_rank, n, "llama", dims, timeout_s=600)
    want = reference("llama")
    r0 = runs[0]
    diff = max_abs_diff(r0["params"], want["params"])
    loss = max(abs(a - b) for a, b in zip(r0["losses"], want["losses"]))
    label = " · ".join(f"{k} {v}" if v is not True else k for k, v in dims.items())
    m = r0["memory"]
    model, pdims = build("llama")[0], ParallelDims(**dims)
    states = theory.model_state_bytes(model, pdims)  # rank 0's, planned (`compose.theory`)
    args = (model, pdims, 1, 8 // (pdims.dp_replicate * pdims.dp_shard))
    sent = theory.dp_bytes(model, pdims) + theory.tp_bytes(*args) + theory.pp_bytes(*args)
    return TourRow(
        f"every parallelism at once ({label})",
        loss < LOSS_TOL and diff < PARAM_TOL,
        diff,
        memory_per_rank=m["params"] + m["grads"] + m["master"] + m["optimizer"],
        memory_theory=sum(states.values()),
        bytes_per_rank=sum(r0["bytes"].values()),
        bytes_theory=sent + theory.cp_bytes(*args),
    )
