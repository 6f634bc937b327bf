"""Checkers for the exercises of lesson 11 (hash embeddings), one module per exercise.

1. `check_linear_probing(insert, find)` (`linear_probing.py`): linear-probing insert and find
   on a small `ProbeTable`, against a Python dict.
2. `check_owner_and_splits(owner, split_sizes)` (`owner_and_splits.py`): the owner rank of a
   key (modulo placement, negative keys too) and the split sizes of the key all-to-all.
3. `check_dedup_backward(sort_and_dedup, row_gradients)` (`dedup_backward.py`): HugeCTR's
   sort/dedup backward, against `backward.py` and a dense table's autograd gradient.
4. `check_localized_reorder(reorder)` (`localized_reorder.py`): the pooled vectors from the
   slot owners back to sample-major slot order.

Pure functions: no world is started.
"""

from .dedup_backward import EXAMPLE, check_dedup_backward
from .linear_probing import ProbeTable, check_linear_probing
from .localized_reorder import CASES, check_localized_reorder, owner_major
from .owner_and_splits import OWNER_KEYS, check_owner_and_splits

__all__ = [
    "ProbeTable",
    "check_linear_probing",
    "OWNER_KEYS",
    "check_owner_and_splits",
    "EXAMPLE",
    "check_dedup_backward",
    "CASES",
    "owner_major",
    "check_localized_reorder",
]
