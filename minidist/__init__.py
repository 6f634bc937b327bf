"""minidist: distributed training techniques on real torch.distributed, one short module each.

Start here: `minidist.launch(fn, world_size)` runs `fn` on a world of real processes;
`minidist.comm.record()` shows what they communicated; `minidist.memory` what they keep.
"""

from . import comm, memory
from .runtime import RankFailedError, WorldTimeoutError, default_backend, launch, under_torchrun

__all__ = [
    "launch",
    "RankFailedError",
    "WorldTimeoutError",
    "under_torchrun",
    "default_backend",
    "comm",
    "memory",
]
__version__ = "0.1.0"
