"""Lesson 09 (notebooks/09_pipeline.ipynb), pipeline parallelism: schedules as data (GPipe, 1F1B,
interleaved, zero bubble ZB-H1 and ZB-V, DualPipeV), a simulator, and an engine running them on
a world.

Huang et al. 2019 (GPipe); Narayanan et al. 2021 (PipeDream-Flush / 1F1B, and interleaved
1F1B in "Efficient Large-Scale Language Model Training on GPU Clusters"); Qi et al. 2024
("Zero Bubble Pipeline Parallelism"); DeepSeek-AI 2024 (DualPipe, arXiv:2412.19437: its
bidirectional form is lesson 19's, `deepseek/dualpipe.py`).

- `schedules.py`: `schedule(kind, stages, microbatches, virtual)`
- `simulate.py`: `simulate(steps, forward, backward, weight, latency, placement, paired)`
  -> Timeline
- `theory.py`: bubble fractions and peak micro-batches alive
- `stages.py`: `Stage` (a copy of any decoder model holding some layers, its own forward
  running), `GPTStage`, `split_gpt`; `engine.py`: `PipelineParallel` (`timings`: step times)
- `backward.py`: the zero-bubble split of a stage's backward into B and W
- `fixture.py`, `plots.py`, `check.py`, `lesson.py`: the course side (rank functions, Gantt
  charts, exercise checkers, the "pipeline 1F1B" tour row and the `pp` bench)
"""

from .engine import PipelineParallel, split_gpt
from .schedules import schedule
from .simulate import simulate

__all__ = ["schedule", "simulate", "PipelineParallel", "split_gpt"]
