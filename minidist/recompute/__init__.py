"""Lesson 06 (in progress), activation recomputation: save a segment's inputs, recompute its
activations in backward (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost").

- `checkpoint.py`: `checkpoint(fn, *args)`, `recompute(module)` in place (names kept),
  `checkpoint_sequential(modules, segment, x)`
- `theory.py`: saved-activation bytes with and without, and with segments of k
"""

from .checkpoint import checkpoint, checkpoint_sequential, recompute

__all__ = ["checkpoint", "recompute", "checkpoint_sequential"]
