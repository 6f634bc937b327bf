"""Checkers for the exercises of lesson 18 (training for real).

1. `check_checkpoint_interval(checkpoint_interval)`: `checkpoint_interval(save_s, mtbf_s)`
   returns (Young's, Daly's) optimal work between saves, in seconds (Young 1974: √(2δM);
   Daly 2006, section 4: √(2δM)·(1 + ⅓·√(δ/2M) + (1/9)·(δ/2M)) − δ, and M when δ ≥ 2M).
   Compared on sampled (δ, M), Llama 3's M (Dubey et al. 2024, section 3.3.4) and δ ≥ 2M.
   Named mistakes: the 2 or the square root forgotten, δ/M for δ·M, hours or minutes for
   seconds, the pair swapped, Daly's −δ, ⅓ or 1/9 term, √ in the ⅓ term, δ/M for δ/2M, δ ≥ 2M
   not handled, Daly's answer Young's.
2. `check_reshard_flat(reshard_flat)`: `reshard_flat(numel, saved_world, new_world,
   new_rank)` returns the pieces of a saved ZeRO flat buffer that rank `new_rank` of
   `new_world` needs: a list of (saved rank, start, stop), offsets inside that saved rank's
   shard, whose concatenation is the new rank's shard. Each shard is `ceil(numel / world)`
   elements of the flat buffer, padding excluded (a universal checkpoint stores no padding:
   Lian et al. 2024, section 3). Compared on sampled sizes and worlds (numel < world,
   multiples and not). Named mistakes: floor for ceil, the worlds swapped, offsets in the
   buffer rather than the shard, stop one short or one past, padding read, only the first
   overlapping shard, the pieces reversed, the wrong rank's pieces.

Both call the learner in this process: an exception becomes a message (what, where, the
likely cause), never a raw traceback.
"""

from .interval import INTERVAL_CASES, check_checkpoint_interval
from .reshard import RESHARD_CASES, check_reshard_flat

__all__ = [
    "INTERVAL_CASES",
    "check_checkpoint_interval",
    "RESHARD_CASES",
    "check_reshard_flat",
]
