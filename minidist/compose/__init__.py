"""Lesson 17, every parallelism at once: one rank grid, one model, 5D training equal to one
process. `python -m minidist train ...` runs a layout (`minidist.trainer`). Notebook
`notebooks/17_every_parallelism.ipynb`; exercises `exercises/17_every_parallelism.ipynb`.

- `dims.py`: `ParallelDims` (torchtitan's names) and the grid every group comes from
- `parallelize.py`: `parallelize(model, dims)`, the steps in order, the gradient table;
  `layout_check.py`: what a model cannot be composed into, refused before any rank starts
- for any model (the course GPT, its MoE form and Llama, a transformers causal LM),
  functions that edit a copy of it in place, its own forward running once:
  `split.py` (the model cut into lesson 09's stages, `pipeline.stages.Stage`, which find
  which module is which with `minidist.model_parts`), `tensor_parallel.py`,
  `context_parallel.py` (ring attention as its attention kernel), `experts.py` (its experts
  over ep)
- `state.py`: the training state as `minidist.pieces.Piece`s (lesson 18's contract)
- `fixture.py`: the models, data and runs the tests and the notebook share; one step
- `optim.py`: AdamW's decay on ndim ≥ 2, the learning-rate schedule, clipping by the
  global norm over every rank's share
- `theory.py`, `tensor_bytes.py`: the planned model states and bytes per group kind;
  `published.py`: Llama 3 405B's layouts planned; `plots.py`: the grid, planned vs measured
- `check/`: the checkers of the lesson's exercises
- `torch_native.py`: torch's own composition of a layout (FSDP2, DTensor TP/SP, pipelining),
  the other side of `bench compose`
"""

from .dims import Grid, ParallelDims, grid_groups
from .parallelize import ComposedParallel, check_layout, parallelize

__all__ = ["ParallelDims", "Grid", "grid_groups", "ComposedParallel", "parallelize", "check_layout"]
