"""Lesson 14, sequence parallelism: the layer norms and residuals split along the sequence.

Notebook `notebooks/14_sequence_parallel.ipynb`; exercises
`exercises/14_sequence_parallel.ipynb`. Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models" (arXiv:2205.05198), section 4.2.2.

The technique itself lives beside the tensor parallelism it extends (lesson 07):
`TensorParallelGPT(dense, group, sequence_parallel=True)`, with the communication in
`minidist/megatron/sequence.py` (all-gather and reduce-scatter along the sequence, the
column-parallel Linear that stores only its block of the input). This package holds the rest
of the lesson:

- `theory.py`: collectives and bytes per step; activations per layer term by term, the
  paper's (16-bit, dropout) and this course's kernels'
- `fixture.py`: the rank functions the notebook, tests and tour share
- `plots.py`: activations per rank by term, tensor parallelism against sequence parallelism
- `check/`: the exercise checkers, a module each; `lesson.py`: the tour row and the `sp` bench
  (against torch's `SequenceParallel`)
"""

from ..megatron.sequence import (
    gather_from_sequence,
    linear_with_sequence_gather,
    reduce_scatter_to_sequence,
)

__all__ = ["gather_from_sequence", "reduce_scatter_to_sequence", "linear_with_sequence_gather"]
