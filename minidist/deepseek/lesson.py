"""Lesson 19's tour row: a tiny transformers DeepSeek-V3 trained by the trainer on
dp_shard 2 · ep 2 · pp (the rest of the world), its routing bias updated on the global load
every step, against the same run in one process."""

from __future__ import annotations

from pathlib import Path

from ..registry import TourRow, tour_row
from ..runtime import launch
from ..training import max_abs_diff
from .fixture import tiny_deepseek_v3


@tour_row("DeepSeek-V3 (dp_shard x ep x pp, bias update)", lesson=19)
def deepseek_row(world_size: int, out_dir: Path) -> TourRow:
    from ..compose.dims import ParallelDims
    from ..trainer.cli import dims_of, parse
    from ..trainer.loop import reference, train_rank

    pp = max(1, world_size // 2)
    args = parse(
        [
            "--model",
            f"{tiny_deepseek_v3.__module__}:tiny_deepseek_v3",
            "--dp-shard",
            "2",
            "--ep",
            "2",
            "--pp",
            str(pp),
            "--steps",
            "3",
            "--global-batch",
            "8",
            "--moe-bias-update-speed",
            "0.01",
        ]
    )
    dims = dims_of(args)
    got = launch(train_rank, ParallelDims(**dims).world_size, args, dims, timeout_s=600)[0]
    ref = reference(args)
    # lesson 17's tolerances: losses to 1e-5; parameters to 1e-3 (Adam's 1/√v magnifies the
    # reduction order where a gradient is near 0)
    loss = max(abs(a - b) for a, b in zip(got["losses"], ref["losses"]))
    params = max_abs_diff(got["params"], ref["params"])
    return TourRow(
        "DeepSeek-V3 (dp_shard x ep x pp, bias update)",
        loss < 1e-5 and params < 1e-3,
        max(loss, params),
        None,
        None,
        None,
        None,
    )
