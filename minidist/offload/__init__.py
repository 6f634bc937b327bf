"""Lesson 05, offload: optimizer state, fp32 masters and gradients kept off the compute
device, in host memory (ZeRO-Offload) or in memory-mapped files (ZeRO-Infinity's NVMe tier),
with bytes per tier and bytes moved per step counted.

Notebook `notebooks/05_offload.ipynb`; exercises `exercises/05_offload.ipynb`. Ren et al.
2021, "ZeRO-Offload: Democratizing Billion-Scale Model Training" (USENIX ATC); Rajbhandari
et al. 2021, "ZeRO-Infinity: Breaking the GPU Memory Wall for Extreme Scale Deep Learning"
(SC21).

- `optimizer.py`: `OffloadOptimizer` (tiers "cpu" and "disk")
- `theory.py`: bytes per tier, bytes over the bus per step, ZeRO-Offload's placements
- `fixture.py`: the rank functions the notebook, tests and tour run (FSDP + offload)
- `plots.py`: where each state lives per tier, bytes moved, the disk tier's files
- `check.py`: the exercise checkers; `lesson.py`: the tour rows
"""

from .optimizer import OffloadOptimizer
from .theory import bytes_moved_per_step, tier_bytes

__all__ = ["OffloadOptimizer", "tier_bytes", "bytes_moved_per_step"]
