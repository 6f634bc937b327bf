"""Checkers for the ZeRO exercises of lesson 02 (Rajbhandari et al. 2020, "ZeRO", section 5).

1. `check_shard_with_padding(shard_with_padding)`: `shard_with_padding(tensor, rank,
   world_size)` flattens `tensor`, pads it with zeros to a multiple of N and returns chunk
   `rank` of ceil(numel / N) elements: the layout of `FlatShard`. Inputs are numbered 1, 2,
   3, ... so every returned value says which element it is (0 is padding).
2. `check_reduce_scatter_bucket(reduce_scatter_bucket)`: `reduce_scatter_bucket(flat_grad)`
   takes this rank's flat gradient bucket (already padded to a multiple of N) and returns the
   mean over ranks of chunk `rank`, with one `comm.reduce_scatter`. Rank r's input, element
   i, is (i + 1) + 100·2^r, so a sum, a mean, a chunk and a rank's own values all differ.
3. `check_zero_stage1(ZeroStage1)`: one flat bucket of ZeRO stage 1. `ZeroStage1(flat_param,
   make_optimizer)` keeps this rank's chunk of the flat parameters as `self.shard` and an
   optimizer over it only; `step(flat_grad)` reduce-scatters the mean gradient of that chunk
   into `self.shard.grad`, steps, and all-gathers the updated chunks into `flat_param`. Run on
   lesson 01's MLP (its parameters are views of `flat_param`) for two Adam steps and
   compared with one process.

All run on real worlds of 2, 3 and 4 ranks (3 gives padding everywhere), compare with the
reference and read a `comm.record()` ledger, so a wrong answer is named: no padding, wrong
chunk, padding not zero, forgot to divide, divided twice, all-reduce instead of
reduce-scatter, optimizer state of the full parameters, forgot the all-gather. An input
that shares memory with its collective's output (a view of flat_param or flat_grad at
another rank's chunk) is refused by `minidist.comm` and named; exactly this rank's own
chunk is the in-place form (NCCL's), accepted: `comm.all_gather(flat_param,
shard.detach())` needs no copy.
"""

from .reduce_scatter import BUCKET_NUMEL, RS_HANG_HINT, RS_WORLDS, check_reduce_scatter_bucket
from .shard_with_padding import SHARD_CASES, check_shard_with_padding
from .stage1 import (
    LR,
    PARAM_ATOL,
    STAGE1_HANG_HINT,
    STAGE1_STEPS,
    STAGE1_WORLDS,
    check_zero_stage1,
    make_adam,
)

__all__ = [
    "BUCKET_NUMEL",
    "RS_WORLDS",
    "RS_HANG_HINT",
    "check_reduce_scatter_bucket",
    "SHARD_CASES",
    "check_shard_with_padding",
    "STAGE1_WORLDS",
    "STAGE1_STEPS",
    "LR",
    "PARAM_ATOL",
    "STAGE1_HANG_HINT",
    "make_adam",
    "check_zero_stage1",
]
