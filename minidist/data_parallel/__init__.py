"""Lesson 01, data parallelism: naive all-reduce and bucketed, overlapped DDP.

Notebook `notebooks/01_data_parallel.ipynb`; exercises `exercises/01_data_parallel.ipynb`.
Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel Training".

- `naive.py`, `bucketed.py`: the technique, naive beside optimised (`buckets.py`: the
  bucket plan and `GradBucket`)
- `theory.py`: bytes per step and memory per rank, as functions
- `fixture.py`: the same model and global batches everywhere, and the rank functions
- `timeline.py`, `plots.py`: when communication ran, and the pictures
- `check.py`: the exercise checkers; `lesson.py`: the tour rows and the bench
"""

from .bucketed import BucketedDataParallel
from .buckets import GradBucket, plan_buckets
from .naive import NaiveDataParallel

__all__ = ["NaiveDataParallel", "BucketedDataParallel", "GradBucket", "plan_buckets"]
