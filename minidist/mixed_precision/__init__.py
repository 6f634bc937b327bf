"""Lesson 04, mixed precision: fp32 master state with fp16/bf16 compute copies, gradient
reduction in a chosen dtype, and dynamic loss scaling agreed on by every rank.

Notebook `notebooks/04_mixed_precision.ipynb`; exercises `exercises/04_mixed_precision.ipynb`.
Micikevicius et al. 2018, "Mixed Precision Training" (ICLR); Kalamkar et al. 2019, "A Study
of BFLOAT16 for Deep Learning Training"; Rajbhandari et al. 2020, "ZeRO", section 3.1.

- `minidist/policy.py` (below every lesson; 01-03 use it too): `MixedPrecision`, casts
- `scaler.py`: `DynamicLossScaler`, `torch.amp.GradScaler`'s rule with a shared "found inf"
- `theory.py`: number formats and where values fall in them, 2Ψ + 2Ψ + 12Ψ per stage, bytes
- `fixture.py`: the rank functions the notebook, tests and tour run
- `plots.py`: number lines, the loss scale over steps, loss curves against fp32
- `check.py`: the exercise checkers; `lesson.py`: the tour rows
"""

from ..policy import MixedPrecision, divide_factors
from .scaler import DynamicLossScaler

__all__ = ["MixedPrecision", "DynamicLossScaler", "divide_factors"]
