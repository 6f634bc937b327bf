"""Checkers for lesson 14's exercises (Korthikanti et al. 2022, section 4.2.2).

1. `check_reduce_scatter_to_sequence(ReduceScatterToSequence)`: ḡ as a
   `torch.autograd.Function`: `forward(ctx, x, group)` takes every rank's partial output
   [b, s, h] and returns this rank's block of the sequence of their sum, [b, s/t, h];
   `backward(ctx, grad)` all-gathers the gradient blocks back to [b, s, h]. Run on worlds
   of 2 and 3 (the group is the world) and of 4 (two tp groups of 2), on a non-contiguous
   input in float64 and a contiguous one in float32, with the sequence and the hidden size
   different so that a split of the wrong dimension shows; then on a world of 3 whose rank 1
   holds an all-zero partial output and gradient block (`SP_ZERO`), so that a collective
   skipped for zeros shows as the hang it is. Every mistake of the tests' `SP_MISTAKES` is
   predicted from the inputs and named (`reduce_scatter_diagnoses`).
2. `check_sp_activation_bytes(fn)`: `fn(s, b, h, a, t)` returns Korthikanti's bytes of
   one layer's activations per rank with tensor and sequence parallelism (16-bit, dropout),
   s·b·h·(34/t + 5·a·s/(h·t)), compared on a grid of sizes (t that does not divide s·b·h
   too, small layers whose bytes are not whole) with the predictions of the usual formula
   mistakes; any other formula that is a sum of s·b·h and a·s²·b terms is named term by term.
"""

from .activation_bytes import ACT_GRID, ACT_MISTAKES, check_sp_activation_bytes
from .reduce_scatter import SP_CASES, SP_HANG_HINT, SP_SHAPE, check_reduce_scatter_to_sequence

__all__ = [
    "SP_CASES",
    "SP_SHAPE",
    "SP_HANG_HINT",
    "check_reduce_scatter_to_sequence",
    "ACT_GRID",
    "ACT_MISTAKES",
    "check_sp_activation_bytes",
]
