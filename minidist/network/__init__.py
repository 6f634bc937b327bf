"""Lesson 12, the shape of the network: collectives built for a 2D mesh or torus of chips and
for nodes of GPUs, and where to put the heavier traffic. With `minidist.parameter_server` it
forms one lesson, notebook 12; the course files live in that package.

A TPU pod links its chips by a 2D torus of inter-chip links (Jouppi et al. 2020, "A Domain-
Specific Supercomputer for Training Deep Neural Networks", CACM; Ying et al. 2018, "Image
Classification at Supercomputer Scale", which all-reduces along one torus dimension, then
the other); a GPU cluster has fast links inside a node (NVLink) and slower ones between
nodes, where the hierarchical all-reduce reduces inside the node first (Jia et al. 2018,
"Highly Scalable Deep Learning Training System with Mixed-Precision"; Sergeev & Del Balso
2018, "Horovod", whose `HOROVOD_HIERARCHICAL_ALLREDUCE` does the same).

- `layout.py`: `Mesh2D` (row and column groups of an R×C grid) and `Nodes` (intra- and
  inter-node groups), and the ledger's bytes per link class
- `all_reduce.py`: `two_level_all_reduce`, `torus_all_reduce`, `hierarchical_all_reduce`
- `theory.py`: bytes per rank per link class and α-β times with a bandwidth per link class
- `published.py`: worked examples with published link figures (a TPU v3 slice, DGX A100 and
  H100 clusters): which shape is fastest, where tensor parallelism goes
"""

from .all_reduce import hierarchical_all_reduce, torus_all_reduce, two_level_all_reduce
from .layout import Mesh2D, Nodes, bytes_by_link_class, mesh_groups, node_groups
from .theory import Link, predict_times, two_level_bytes

__all__ = [
    "Mesh2D",
    "Nodes",
    "mesh_groups",
    "node_groups",
    "bytes_by_link_class",
    "two_level_all_reduce",
    "torus_all_reduce",
    "hierarchical_all_reduce",
    "Link",
    "two_level_bytes",
    "predict_times",
]
