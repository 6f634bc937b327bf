"""DualPipe as data (DeepSeek-AI 2024, arXiv:2412.19437, section 3.2.1, Figure 5).

Two copies of the model run through the same p ranks in opposite directions: rank r holds
stage r of the forward copy (direction 0, fed at rank 0) and stage p-1-r of the reverse
copy (direction 1, fed at rank p-1), m/2 micro-batches each. A step is lesson 09's
("F" | "B" | "W", micro-batch of its direction, direction[, OVERLAP]), a full backward a B
then its W, an overlapped forward-and-backward pair a marked forward then that backward.

Rank r and rank p-1-r run the same order with the directions swapped, and that order is
DualPipeV's (`pipeline.schedules.dualpipe_v`) on p/2 ranks with m/2 micro-batches: fold
DualPipe's two pipelines in the middle and each half is DualPipeV's V (the "cut in half"
the reference's README credits to Sea AI Lab). The simulator runs it with
`placement="dual"`. Nothing here executes a model: lesson 17's engine runs DualPipeV.
"""

from __future__ import annotations

from ..pipeline.schedules import dualpipe_v


def dualpipe(stages: int, microbatches: int) -> list[list[tuple]]:
    """The steps of every rank, rank 0 first: p even, m even and m >= 2p."""
    p, m = stages, microbatches
    for name, value in (("stages", p), ("microbatches", m)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 2 or value % 2:
            raise ValueError(
                f"dualpipe: {name}={value!r} must be an even int >= 2 (two directions: "
                "half the ranks and half the micro-batches each)"
            )
    if m < 2 * p:
        raise ValueError(f"dualpipe: microbatches={m} must be >= 2 × stages = {2 * p}")
    return [_rank(r, p, m) for r in range(p)]


def _rank(r: int, p: int, m: int) -> list[tuple]:
    half = min(r, p - 1 - r)  # the distance to the nearer end: where the V's rank sits
    flip = r >= p // 2  # the second half of the ranks meets the reverse direction first
    return [(op, i, c ^ flip, *rest) for op, i, c, *rest in dualpipe_v(half, p // 2, m // 2)]
