"""Lesson 15, context parallelism: ring attention over a sequence split across ranks.

Notebook `notebooks/15_context_parallel.ipynb`; exercises `exercises/15_context_parallel.ipynb`.
Liu et al. 2023, "Ring Attention with Blockwise Transformers for Near-Infinite Context"
(arXiv:2310.01889), section 3; the online softmax of Milakov & Gimelshein 2018; the zig-zag
split of Megatron-LM's context parallelism (`get_batch_on_this_cp_rank`) and of
ring-flash-attention (`zigzag_ring_flash_attn_func`).

- `split.py`: which positions each rank holds, contiguous or zig-zag
- `ring.py`: `ring_attention` (an autograd Function: forward and backward around the ring,
  each block's transfer overlapped with its computation), `block_attention` and the
  online-softmax `merge`
- `timeline.py`: when each rank computed and when its blocks travelled (the overlap)
- `kernel.py`: ring attention as an attention kernel (transformers' attention interface),
  the one call of a model's attention that context parallelism swaps
- `model.py`: `ContextParallelGPT`, the course GPT on 1/c of every sequence
- `theory.py`: bytes per layer and step, causal work per rank and its imbalance
- `fixture.py`, `plots.py`, `check/`, `lesson.py`: the rank functions, figures, exercise
  checkers and the tour row
"""

from .model import ContextParallelGPT
from .ring import block_attention, merge, ring_attention

__all__ = ["ContextParallelGPT", "block_attention", "merge", "ring_attention"]
