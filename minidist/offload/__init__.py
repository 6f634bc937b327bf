"""Lesson 05 (in progress), offload: optimizer state, fp32 masters and gradients kept off the
compute device, in host memory (ZeRO-Offload) or in memory-mapped files (ZeRO-Infinity's
NVMe tier), with bytes per tier and bytes moved per step counted.

- `optimizer.py`: `OffloadOptimizer`
"""

from .optimizer import OffloadOptimizer

__all__ = ["OffloadOptimizer"]
