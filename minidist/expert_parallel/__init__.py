"""Lesson 16, expert parallelism: a mixture of experts with its experts placed over ranks.

Notebook `notebooks/16_expert_parallel.ipynb`; exercises `exercises/16_expert_parallel.ipynb`.
Fedus et al. 2022, "Switch Transformers: Scaling to Trillion Parameter Models with Simple and
Efficient Sparsity" (JMLR), section 2; Lepikhin et al. 2020, "GShard: Scaling Giant Models
with Conditional Computation and Automatic Sharding" (arXiv:2006.16668), sections 2.2 and 3.

- `routing.py`: the top-k router, capacity, priority and dropping, the auxiliary loss
- `moe.py`: `MoE`, the layer in one process (a dense loop over the experts)
- `parallel.py`: `ExpertParallelMoE`, E experts over e ranks, dispatch and combine with
  all-to-all, gradients reduced over the ranks holding the same expert (EP × DP)
- `theory.py`: all-to-all bytes for a measured routing, the counts, the gradients
- `fixture.py`, `plots.py`, `check.py`, `lesson.py`: the rank functions, figures, exercise
  checkers and the tour row
"""

from .gpt import ExpertParallelGPT, moe_gpt
from .moe import MoE
from .parallel import ExpertParallelMoE

__all__ = ["ExpertParallelGPT", "ExpertParallelMoE", "MoE", "moe_gpt"]
