"""`MixedPrecision` and its helpers, which lessons 01-03's wrappers use too, live below every
lesson in `minidist/policy.py`; this module keeps the names importable from lesson 04."""

from ..policy import DTYPES, MixedPrecision, cast_floating, cast_module_state, divide_factors

__all__ = ["DTYPES", "MixedPrecision", "cast_floating", "cast_module_state", "divide_factors"]
