"""All-reduce in two levels: reduce-scatter on the inner links, all-reduce on the outer
links, all-gather on the inner links.

On an R×C mesh with row links inner (`torus_all_reduce(t, mesh, inner="row")`): each row
reduce-scatters the tensor so that the rank in column c holds the row's sum of chunk c;
each column all-reduces its chunk c (now the sum over every rank); each row all-gathers the
C chunks. The transposed order (`inner="column"`) swaps the roles. A cluster's hierarchical
all-reduce (`hierarchical_all_reduce`) is the same three steps with the node as the inner
group (Jia et al. 2018, section 4.2; Horovod's hierarchical all-reduce): only 1/G of the
tensor crosses the slow links between nodes.

Per rank the bytes sent add up to the flat ring's 2(N-1)/N·S (see `theory.two_level_bytes`),
but the inner links carry 2(C-1)/C·S and the outer links only 2(R-1)/R·S/C: the order
decides which direction gets the heavy share, and a ring of R or C steps replaces one of N.
The tensor is padded to a multiple of R·C so every chunk is equal (the pad is summed too and
dropped). Only `ReduceOp.SUM` and contiguous tensors; a real 2D-torus all-reduce also runs
both directions of each ring and both dimensions at once, which this module does not model.
The native equivalent: NCCL chooses ring or tree inside its own topology search; JAX's
`psum` over a mesh axis.
"""

from __future__ import annotations

import torch

from .. import comm
from .layout import Mesh2D, Nodes, TwoLevelLayout


def padded_numel(numel: int, inner_size: int, outer_size: int) -> int:
    """Elements after padding to a multiple of inner·outer (every chunk equal)."""
    block = inner_size * outer_size
    return -(-numel // block) * block


def two_level_all_reduce(tensor: torch.Tensor, layout: TwoLevelLayout, inner: str) -> torch.Tensor:
    """Sum `tensor` over every rank of `layout`, in place: inner reduce-scatter, outer
    all-reduce, inner all-gather. `inner` is one of the layout's two link classes."""
    kinds = (layout.inner_class, layout.outer_class)
    if inner not in kinds:
        raise ValueError(f"two_level_all_reduce: inner must be one of {kinds}, got {inner!r}")
    if not tensor.is_contiguous():
        raise ValueError("two_level_all_reduce: tensor must be contiguous (it is reduced in place)")
    outer = kinds[1] if inner == kinds[0] else kinds[0]
    n_in, n_out = layout.size(inner), layout.size(outer)
    flat = tensor.view(-1)
    buf = flat.new_zeros(padded_numel(flat.numel(), n_in, n_out))
    buf[: flat.numel()] = flat
    chunk = buf.new_empty(buf.numel() // n_in)
    comm.reduce_scatter(chunk, buf, group=layout.group(inner), tag=inner)
    comm.all_reduce(chunk, group=layout.group(outer), tag=outer)
    comm.all_gather(buf, chunk, group=layout.group(inner), tag=inner)
    flat.copy_(buf[: flat.numel()])
    return tensor


def torus_all_reduce(tensor: torch.Tensor, mesh: Mesh2D, inner: str = "row") -> torch.Tensor:
    """2D-mesh all-reduce, in place: reduce-scatter along `inner` ("row" or "column"),
    all-reduce along the other direction, all-gather along `inner`."""
    return two_level_all_reduce(tensor, mesh, inner)


def hierarchical_all_reduce(tensor: torch.Tensor, nodes: Nodes) -> torch.Tensor:
    """Reduce-scatter inside the node, all-reduce across nodes, all-gather inside the node."""
    return two_level_all_reduce(tensor, nodes, "intra")
