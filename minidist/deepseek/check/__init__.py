"""Checkers for lesson 19's exercises (DeepSeek-V3, arXiv:2412.19437).

1. `check_bias_update(update)`: `update(bias, load, speed)` returns the new routing bias
   b − γ·sign(load − mean load) (§2.1.2), a new tensor of bias's dtype. Checked on loads of
   2 to 8 experts (experts exactly at the mean, all balanced, a mean that is not a whole
   number), float32 and float64 biases.
2. `check_tile_scales(quantize)`: `quantize(x)` returns (values, scales), x in 1×128 tiles
   (one per token and 128 channels, the last one ragged) as `float8_e4m3fn` with one
   float32 scale amax / 448 each (§3.3.1). Checked on 1 to 5 rows of 128, 200, 384 and
   1,000 columns, float32 and bf16, zero tiles.
3. `check_dualpipe_bubble(bubble)`: `bubble(pp, F, B, W, FB)` returns Table 2's DualPipe
   bubble (PP/2 − 1)(F&B + B − 3W) (§3.2.1), on PP of 2 to 14 with costs that tell the
   mistakes apart.

Every catalogued mistake (`tests/test_check_deepseek_*.py`) is named.
"""

from .bias_update import check_bias_update
from .dualpipe_bubble import check_dualpipe_bubble
from .fp8_scales import check_tile_scales

__all__ = ["check_bias_update", "check_dualpipe_bubble", "check_tile_scales"]
