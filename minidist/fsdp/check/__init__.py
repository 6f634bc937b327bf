"""Checkers for the FSDP exercises of lesson 03: the three moves of a flat parameter.

Zhao et al. 2023, "PyTorch FSDP", section 3.2.1 (FlatParameter) and 3.3 (unshard, reshard,
reduce-scatter of the flat gradient).

1. `check_flatten_and_shard(flatten_and_shard)`: `flatten_and_shard(params, rank, world)`
   returns `(chunk, offsets)`: the parameters' elements one after another, zero padding up to
   a multiple of N, and rank r's contiguous chunk [r·c, (r+1)·c), c = padded / N; `offsets[i]`
   is where parameter i starts. A pure function, so it is checked in this process for every
   rank of several worlds, the paper's 15 elements on 16 ranks included. Each element's value
   says where it came from (element j of the flat buffer holds j + 1, padding 0), so a wrong
   chunk is named: no padding, another rank's chunk, a strided shard, padding not zero;
   and the chunk must be what the text promises: a new tensor outside autograd, in the
   parameters' dtype (bfloat16 and transposed parameters are among the cases).
2. `check_unshard(unshard, reshard)`: on worlds of 2, 3 and 4, `unshard(full, chunk, offsets,
   shapes)` re-allocates the freed storage of the persistent flat buffer `full`, all-gathers
   every rank's chunk into it and returns views of it shaped like the parameters; `reshard(
   full)` frees the storage again, keeping the tensor. Then the chunks change (an optimizer
   step) and `unshard` runs again: the views of the first call must see the new values, as
   the views autograd saved in forward must in backward. Named: storage not re-allocated,
   views into a temporary, padding inside a view, wrong offsets, storage not freed, the
   tensor replaced instead of its storage freed, views that lost their storage, an all-reduce
   instead of an all-gather, a gather into a temporary full-size buffer (`course.watch`).
3. `check_reduce_scatter_grad(reduce_scatter_grad)`: on worlds of 3, 2 and 4, each rank's flat
   (padded) gradient of one MLP unit on its slice of the batch goes in; this rank's chunk of
   the mean over ranks must come out, compared with one process on the whole batch. Named:
   forgot to divide by N, divided twice, nothing reduced, another rank's chunk, the whole
   flat gradient kept, and (from the ledger) an all-reduce where a reduce-scatter sends half
   the bytes.
"""

from ._shared import WORLDS
from .flatten import FLAT_CASES, check_flatten_and_shard
from .reduce_scatter import GRAD_BATCH, GRAD_WORLDS, check_reduce_scatter_grad
from .unshard import STEP, UNSHARD_SHAPES, check_unshard

__all__ = [
    "WORLDS",
    "FLAT_CASES",
    "check_flatten_and_shard",
    "GRAD_BATCH",
    "GRAD_WORLDS",
    "check_reduce_scatter_grad",
    "UNSHARD_SHAPES",
    "STEP",
    "check_unshard",
]
