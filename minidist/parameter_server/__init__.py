"""Lesson 12, parameter servers: S server ranks own key ranges of the parameters and optimizer
state, W workers push gradients and pull parameters, under BSP, bounded staleness (SSP) or
no synchronisation at all. With `minidist.network` (the shape of the network) it forms one
lesson, notebook 12; the lesson's course files (tour rows, plots, checkers) live here.

Li et al. 2014, "Scaling Distributed Machine Learning with the Parameter Server" (OSDI);
Dean et al. 2012, "Large Scale Distributed Deep Networks" (NIPS, Downpour SGD); Ho et al.
2013, "More Effective Distributed ML via a Stale Synchronous Parallel Parameter Server"
(NIPS); Cui et al. 2016, "GeePS: Scalable Deep Learning on Distributed GPUs with a
GPU-Specialized Parameter Server" (EuroSys).

- `keys.py`: roles (servers, then workers), key ranges, the flat view of the parameters
- `server.py`: `ShardServer`, a key range, its SGD state and the consistency rule
- `worker.py`: `Worker`, pull / push / done
- `theory.py`: bytes per step of a worker and a server, against ring all-reduce; α-β times
- `fixture.py`: `train_on_rank` (serve or train), `reference` (one process)
- `lesson.py`, `plots.py`, `check.py`: lesson 12's tour rows, pictures and exercise checkers
"""

from .fixture import staleness_bound, train_on_rank
from .keys import check_roles, key_ranges, owner
from .server import AppliedGradient, ShardServer, pull_bound
from .worker import Worker

__all__ = [
    "ShardServer",
    "Worker",
    "AppliedGradient",
    "train_on_rank",
    "staleness_bound",
    "pull_bound",
    "check_roles",
    "key_ranges",
    "owner",
]
