"""Lesson 03, FSDP: fully sharded data parallelism (ZeRO stage 3) with flat-parameter units,
prefetch, `no_sync`, clipping across shards, hybrid sharding.

Notebook `notebooks/03_fsdp.ipynb`; exercises `exercises/03_fsdp.ipynb`.
Zhao et al. 2023, "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel";
Rajbhandari et al. 2020, "ZeRO", section 5.3.

- `unit.py`: `FlatParamUnit`, one module's parameters as a flat, sharded parameter
- `fully_sharded.py`: `FullyShardedDataParallel`
- `checkpoint.py`: sharded checkpoints with `torch.distributed.checkpoint` (`save`, `load` on
  a world of any size, `load_full` in one process); also for `ZeroDataParallel`
- `checkpoint_layout.py`: what such a checkpoint holds (keys, the layout record);
  `checkpoint_check.py`: the checks that refuse another model's checkpoint before a load;
  `checkpoint_full.py`: `load_full`, a checkpoint read whole in one process
- `theory.py`: bytes per step by collective, memory per rank, peak parameter memory
- `fixture.py`: the rank functions the notebook, tests and tour share
- `timeline.py`, `plots.py`: one step observed unit by unit, and the pictures
- `check.py`: the exercise checkers; `lesson.py`: the tour rows (and imports `bench.py`)
"""

from .fully_sharded import FullyShardedDataParallel
from .unit import FlatParamUnit

__all__ = ["FullyShardedDataParallel", "FlatParamUnit"]
