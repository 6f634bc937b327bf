"""Checkers for lesson 19's exercises (DeepSeek-V3, arXiv:2412.19437).

`check_bias_update(update)`: `update(bias, load, speed)` returns the new routing bias
b − γ·sign(load − mean load) (§2.1.2), a new tensor of bias's dtype. Checked on loads of 2 to
8 experts (experts exactly at the mean, all balanced, a mean that is not a whole number),
float32 and float64 biases; every catalogued mistake (`tests/test_check_deepseek_moe.py`)
is named.
"""

from .bias_update import check_bias_update

__all__ = ["check_bias_update"]
