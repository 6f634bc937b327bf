"""Lesson 02, ZeRO: shard the optimizer states (stage 1) and the gradients (stage 2) over the
data-parallel ranks; cross-replica weight-update sharding is the same idea.

Notebook `notebooks/02_zero.ipynb`; exercises `exercises/02_zero.ipynb`. Rajbhandari et al.
2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"; Xu et al. 2020,
"Automatic Cross-Replica Sharding of Weight Update in Data-Parallel Training".

- `flat.py`: the flat, padded, sharded layout (`FlatShard`), shared with FSDP
- `sharded.py`: `ZeroDataParallel` (stages 1 and 2, weight-update sharding options)
- `sharded_optimizer.py`: its `ShardedOptimizer` (the step on this rank's chunks) and
  `clip_sharded_grad_norm_` (the global norm over shards, shared with FSDP)
- `theory.py`: memory per device (the paper's formulas) and bytes per step
- `fixture.py`: the rank functions the notebook, tests and tour run
- `plots.py`: memory per rank by state type and against N, the flat padded layout
- `check.py`: the exercise checkers; `lesson.py`: the tour rows
"""

from .flat import FlatShard
from .sharded import ZeroDataParallel
from .theory import bytes_sent_per_step, memory_per_device

__all__ = ["FlatShard", "ZeroDataParallel", "memory_per_device", "bytes_sent_per_step"]
