"""Lessons 07 and 08 in one package: Megatron tensor parallelism, and the parallel layout.

Lesson 07, tensor parallelism: notebook `notebooks/07_tensor_parallel.ipynb`, exercises
`exercises/07_tensor_parallel.ipynb`; Shoeybi et al. 2019, "Megatron-LM: Training
Multi-Billion Parameter Language Models Using Model Parallelism", section 3.
Lesson 08, the parallel layout (tensor inside a node, pipeline and data across): notebook
`notebooks/08_parallel_layout.ipynb`, exercises `exercises/08_parallel_layout.ipynb`;
Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", section 3. The two lessons share the model, the layers and the layout, hence
one package.

- `layout.py`: `parallel_groups(world_size, tp, pp)` and `ParallelLayout` (lesson 08)
- `ops.py`: f, g, scatter and gather along the last dimension (autograd Functions)
- `layers.py`: column/row-parallel Linear, the parallel MLP, vocab-parallel embedding, head
  and cross entropy, the tp ranks' dropout streams
- `plan.py`: `apply_plan`, a model's modules swapped for those layers by name (`GPT_PLAN`)
- `model.py`: `tensor_parallel_gpt` (the plan applied to the course GPT in place, its own
  forward running) and `TensorParallelGPT`, a copy of the GPT so split over a tp group
- `theory.py`: all-reduces and bytes per step, parameters and memory per rank, the layout's
  bytes, the α-β time of TP and DP communication
- `fixture.py`: the rank functions the notebooks, tests and tour run
- `plots.py`: weights split, f and g in a block, memory against t; `layout_plots.py`: the
  rank grid and communication seconds (both re-exported by `plots.py`)
- `check.py`: the exercise checkers of both lessons; `lesson.py`: the tour rows
  ("tensor parallel", "parallel layout") and the `tp` bench
"""

from .layout import ParallelLayout, parallel_groups
from .model import TensorParallelGPT

__all__ = ["parallel_groups", "ParallelLayout", "TensorParallelGPT"]
