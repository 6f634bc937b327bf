"""Lesson 10, 3D parallelism: tensor × pipeline × data parallel (ZeRO-1).

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM". `python -m minidist.three_d` runs it on a local world of 8 ranks;
`torchrun --nproc-per-node 8 -m minidist.three_d` runs the same on a torchrun world.

- `stage.py`: a tensor-parallel pipeline stage of the course GPT (lesson 09's stage, a copy
  of the GPT, edited in place by lesson 07's `tensor_parallel_gpt`)
- `parallel.py`: `ThreeDParallel`
- `run.py`: the 20-step run the test, the script and the notebook share
- `theory.py`: bytes per step by group kind, parameters and memory per rank
- `fixture.py`, `plots.py`, `check.py`, `lesson.py`: notebook 10's measurements, pictures,
  exercise checkers and tour row
"""

from .parallel import ThreeDParallel
from .stage import TensorParallelStage, split_tensor_parallel_gpt

__all__ = ["ThreeDParallel", "TensorParallelStage", "split_tensor_parallel_gpt"]
