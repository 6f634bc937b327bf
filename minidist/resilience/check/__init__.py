"""Checkers for the exercises of lesson 18 (training for real).

1. `check_checkpoint_interval(checkpoint_interval)`: `checkpoint_interval(save_s, mtbf_s)`
   returns (Young's, Daly's) optimal work between saves, in seconds (Young 1974: √(2δM);
   Daly 2006, section 4: √(2δM)·(1 + ⅓·√(δ/2M) + (1/9)·(δ/2M)) − δ, and M when δ ≥ 2M).
   Compared on sampled (δ, M), Llama 3's M (Dubey et al. 2024, section 3.3.4), M ≤ δ < 2M and
   δ ≥ 2M. Named mistakes: the 2 or the square root forgotten, `** 1/2` for a square root,
   δ/M for δ·M, hours or minutes for seconds, M taken in hours, rounding to whole seconds,
   the pair swapped, Daly's −δ, ⅓ or 1/9 term, √ in the ⅓ term, δ/M, `δ/2*M` or `δ // 2M`
   for δ/(2M), the cap at δ ≥ M or none, Daly's answer Young's.
2. `check_reshard_flat(reshard_flat)`: `reshard_flat(numel, saved_world, new_world,
   new_rank)` returns the pieces of a saved ZeRO flat buffer that rank `new_rank` of
   `new_world` needs: a list of (saved rank, start, stop), offsets inside that saved rank's
   shard, whose concatenation is the new rank's shard. Each shard is `ceil(numel / world)`
   elements of the flat buffer, padding excluded (a universal checkpoint stores no padding:
   Lian et al. 2024, section 3). Compared on sampled sizes and worlds (numel < world,
   multiples and not). Empty pieces (start == stop) are ignored; a rank whose new shard is
   empty returns []. Named mistakes: floor or round for ceil, the worlds swapped, offsets in
   the buffer rather than the shard or modulo the new shard size, stop one short or one
   past, padding read, only the first overlapping shard, the pieces reversed, the wrong
   rank's pieces.

A mistake is named only when it gives the learner's answer on every case the learner got
wrong; otherwise the message shows the first wrong case and the rule.

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
