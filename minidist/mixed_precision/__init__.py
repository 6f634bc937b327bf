"""Lesson 04 (in progress), mixed precision: fp32 master state with fp16/bf16 compute copies,
gradient reduction in a chosen dtype, and dynamic loss scaling agreed on by every rank.

Micikevicius et al. 2018, "Mixed Precision Training" (ICLR).

- `policy.py`: `MixedPrecision` (param and reduce dtypes), pre/post-divide factors
- `scaler.py`: `DynamicLossScaler`, `torch.amp.GradScaler`'s rule with a shared "found inf"
"""

from .policy import MixedPrecision, divide_factors
from .scaler import DynamicLossScaler

__all__ = ["MixedPrecision", "DynamicLossScaler", "divide_factors"]
