"""Lesson 00, a world and its collectives: ring all-reduce from send/recv, the α-β model.

Notebook `notebooks/00_world_and_collectives.ipynb`; exercises
`exercises/00_world_and_collectives.ipynb`. Patarasuk & Yuan 2009 (the ring), Hockney 1994
(the α-β model), NCCL-tests doc/PERFORMANCE.md (bus bandwidth).

- `ring.py`: ring all-reduce built from send/recv (teaching; techniques use `comm`)
- `cost_model.py`: time collectives and fit α and the bandwidth
- `theory.py`: bytes a ring sends, as functions
- `plots.py`: who holds what before/after a collective, ring steps, the cost model
- `check.py`: the exercise checkers; `lesson.py`: the tour row
"""

from .cost_model import CostModel, fit_alpha_beta, time_all_reduce
from .ring import ring_all_reduce

__all__ = ["ring_all_reduce", "CostModel", "fit_alpha_beta", "time_all_reduce"]
