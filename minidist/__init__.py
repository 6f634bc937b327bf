"""minidist: distributed training techniques on real torch.distributed, one short module each.

Start here: `minidist.launch(fn, world_size)` runs `fn` on a world of real processes;
`minidist.comm.record()` shows what they communicated; `minidist.memory` what they keep;
`minidist.plan(model, layout, cluster)` predicts all of it for a layout (lesson 13).
"""

from . import comm, memory
from .runtime import (
    RankFailedError,
    WorldTimeoutError,
    default_backend,
    launch,
    rank_device,
    under_torchrun,
)

__all__ = [
    "launch",
    "RankFailedError",
    "WorldTimeoutError",
    "under_torchrun",
    "default_backend",
    "rank_device",
    "comm",
    "memory",
    "plan",
    "parallelize",
    "ParallelDims",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    """`minidist.plan` and `minidist.planner`, imported on first use (the planner imports
    every lesson's theory)."""
    if name in ("parallelize", "ParallelDims"):  # lesson 17, imported on first use
        from . import compose

        return getattr(compose, name)
    if name in ("plan", "planner"):
        from . import planner

        return planner.plan if name == "plan" else planner
    raise AttributeError(f"module 'minidist' has no attribute {name!r}")
