"""Lesson 18, training for real: universal checkpoints, resuming on another layout, surviving
a dead rank.

Dubey et al. 2024, "The Llama 3 Herd of Models", section 3.3.4: 466 job interruptions in 54
days of pre-training on 16,384 GPUs, one about every three hours. Lian et al. 2024,
"Universal Checkpointing" (DeepSpeed): a checkpoint whose keys and fragments are
layout-free resumes on any other layout. Young 1974 and Daly 2006: how often to save.

- `chunks.py`: a piece (box, then flat range) as rectangles of the logical tensor
- `planners.py`: DCP planners writing and reading those rectangles; a reader that verifies
  and counts the bytes it reads
- `universal.py`: `save`, `load` (any layout to any layout), refusals before any change
- `state.py`: the step, the global sample index, the loss scaler, the RNG streams
- `async_save.py`: a save that copies to host memory and writes in the background
- `lesson_pieces.py`: the pieces of lessons 02, 03 and 07's wrappers
- `theory.py`: Young's and Daly's intervals and the fraction of time lost
- the loop that saves, resumes and logs the composed engine (`minidist.compose`) on any
  layout is the trainer's (`minidist.trainer`: `python -m minidist train --save/--resume`)
- `lesson.py`: the bench (a step blocked by a synchronous vs an asynchronous save) and the
  tour row (a resume on another layout)
- `check/`: the exercises' checkers (the Young/Daly interval; a flat ZeRO shard resharded)
"""

from .state import TrainingState, capture_rng, restore_rng
from .universal import CheckpointLayoutError, LoadReport, load, save

__all__ = [
    "save",
    "load",
    "LoadReport",
    "CheckpointLayoutError",
    "TrainingState",
    "capture_rng",
    "restore_rng",
]
