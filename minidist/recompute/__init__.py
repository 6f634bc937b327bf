"""Lesson 06, activation recomputation: save a segment's inputs, recompute its activations in
backward (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost").

Notebook `notebooks/06_recompute.ipynb`; exercises `exercises/06_recompute.ipynb`. Chen et
al. 2016 (arXiv:1604.06174); Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models" (arXiv:2205.05198), section 4, for a transformer layer's bytes.

- `checkpoint.py`: `checkpoint(fn, *args)`, `recompute(module)` in place (names kept),
  `checkpoint_sequential(modules, segment, x)`
- `theory.py`: saved-activation bytes with and without, and with segments of k (Chen et
  al.'s peak, the exact peak of a chain, the best k); a transformer layer's bytes term by term
- `measure.py`: `LiveActivations` (saved bytes over forward and backward, and their peak),
  bytes saved per module, forward/backward times
- `fixture.py`: the models, chains and rank functions the notebook, tests and tour share
- `plots.py`: bytes by part, peak against segment length, time against memory
- `check.py`: the exercise checkers; `lesson.py`: the tour rows (and imports `bench.py`,
  `python -m minidist bench memory`: lessons 01-06 side by side)
"""

from .checkpoint import checkpoint, checkpoint_sequential, recompute

__all__ = ["checkpoint", "recompute", "checkpoint_sequential"]
