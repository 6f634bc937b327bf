"""Lesson 12, parameter servers: S server ranks own key ranges of the parameters and optimizer
state, W workers push gradients and pull parameters, under BSP, bounded staleness (SSP), no
synchronisation at all, or Downpour's apply-on-arrival; GeePS's parameter cache keeps only the
working layers on the device. With `minidist.network` (the shape of the network) it forms one
lesson, notebook 12 (`notebooks/12_parameter_servers_and_topology.ipynb`); the lesson's
course files (tour rows, plots, checkers) live here.

Li et al. 2014, "Scaling Distributed Machine Learning with the Parameter Server" (OSDI);
Dean et al. 2012, "Large Scale Distributed Deep Networks" (NIPS, Downpour SGD); Ho et al.
2013, "More Effective Distributed ML via a Stale Synchronous Parallel Parameter Server"
(NIPS); Cui et al. 2016, "GeePS: Scalable Deep Learning on Distributed GPUs with a
GPU-Specialized Parameter Server" (EuroSys).

- `keys.py`: roles (servers, then workers), key ranges, the flat view of the parameters
- `server.py`: `ShardServer`, a key range, its SGD state and the consistency rule
- `worker.py`: `Worker`, pull / push / done
- `downpour.py`: Downpour SGD's worker (fetch every n_fetch steps, push every n_push)
- `cache.py`: `ParameterCache`, GeePS's device tier of the working layers over a host tier
- `theory.py`: bytes per step of a worker and a server, against ring all-reduce; α-β times;
  Downpour's staleness schedule; the cache's resident bytes, peak and bytes moved
- `fixture.py`: `train_on_rank` (serve or train), `reference` (one process)
- `lesson.py`, `plots.py`, `check/`: lesson 12's tour rows, pictures and exercise checkers
"""

from .cache import CacheEvent, ParameterCache, layer_bytes
from .fixture import staleness_bound, train_on_rank
from .keys import check_roles, key_ranges, owner
from .server import AppliedGradient, ShardServer, pull_bound
from .worker import Worker

__all__ = [
    "ShardServer",
    "Worker",
    "ParameterCache",
    "CacheEvent",
    "layer_bytes",
    "AppliedGradient",
    "train_on_rank",
    "staleness_bound",
    "pull_bound",
    "check_roles",
    "key_ranges",
    "owner",
]
