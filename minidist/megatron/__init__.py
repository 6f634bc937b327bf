"""Lesson 07 (in progress), Megatron tensor parallelism, and the parallel layout (lesson 08).

Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion Parameter Language Models Using
Model Parallelism"; Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
on GPU Clusters Using Megatron-LM" (the layout).

- `layout.py`: `parallel_groups(world_size, tp, pp)` and `ParallelLayout`
- `ops.py`: f, g, scatter and gather along the last dimension (autograd Functions)
- `layers.py`: column/row-parallel Linear, parallel attention and MLP, vocab-parallel
  embedding and cross entropy
- `model.py`: `TensorParallelGPT`, the course GPT split over a tp group
"""

from .layout import ParallelLayout, parallel_groups
from .model import TensorParallelGPT

__all__ = ["parallel_groups", "ParallelLayout", "TensorParallelGPT"]
