"""Data parallelism (SYLLABUS section 1): naive all-reduce and bucketed, overlapped DDP."""

from .bucketed import BucketedDataParallel, plan_buckets
from .naive import NaiveDataParallel, broadcast_parameters

__all__ = ["NaiveDataParallel", "BucketedDataParallel", "broadcast_parameters", "plan_buckets"]
