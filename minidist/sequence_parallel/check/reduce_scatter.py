"""Lesson 14, exercise 1: ḡ, the reduce-scatter that leaves a tensor-parallel region."""

from __future__ import annotations

import torch

from ... import comm
from ...course.check import CheckFailed, fail, passed, run_on_world
from ...megatron.layout import ParallelLayout
from ...runtime import RankFailedError
from .reduce_scatter_diagnoses import (
    SP_SHAPE,
    _diagnose_backward,
    _diagnose_forward,
    _diagnose_ledger,
    _explain_crash,
    _inputs,
    _upstream,
)

SP_CASES = ((2, 2), (3, 3), (4, 2))  # (world, tp): on 4, two tp groups of 2
SP_ZERO = (3, 1)  # a world of 3 (tp = 3) whose tp rank 1 holds all-zero blocks
SP_HANG_HINT = (
    "ḡ makes one reduce-scatter in forward and one all-gather in backward, on every rank of "
    "the tp group, with the same sizes."
)
SP_ZERO_HINT = (
    f"In this world rank {SP_ZERO[1]}'s partial output and gradient block were ALL ZEROS: a "
    "forward or backward that skips its collective when its block is zero (an `if not "
    "x.any()` or `if grad.abs().sum() == 0` shortcut) leaves the other ranks waiting in "
    "theirs, forever under NCCL. Every rank makes the collective, whatever its values."
)


def _sp_rank(cls: type, tp: int, zero: int | None = None) -> list[dict]:
    layout = ParallelLayout(tp=tp)
    group, q = layout.group("tp"), layout.tp_rank
    out = []
    kinds = ((torch.float64, True), (torch.float32, False))
    for dtype, transposed in kinds if zero is None else kinds[1:]:
        base = _inputs(q, dtype, zero)
        leaf = base.transpose(1, 2) if transposed else base.transpose(1, 2).contiguous()
        leaf = leaf.detach().requires_grad_()
        x = leaf * 1  # not a leaf, as a row-parallel Linear's partial output
        before = x.detach().clone()
        res = dict(dtype=dtype, transposed=transposed, tp_ranks=layout.mine["tp"], q=q, zero=zero)
        with comm.record() as forward:
            y = cls.apply(x, group)
        res["forward"] = [(r.op, r.group_ranks, r.payload_bytes) for r in forward.records]
        res["mutated"] = not torch.equal(x.detach(), before)
        if not isinstance(y, torch.Tensor):
            module = type(y).__module__.split(".")[0]
            res["y"] = type(y).__name__ if module == "builtins" else f"{module}.{type(y).__name__}"
            out.append(res)
            continue
        res["y"] = y.detach().clone()
        if y.shape != (SP_SHAPE[0], SP_SHAPE[1] // tp, SP_SHAPE[2]) or not y.requires_grad:
            res["grad"] = None
            out.append(res)
            continue
        with comm.record() as backward:
            y.backward(_upstream(q, tp, dtype, zero))
        res["backward"] = [(r.op, r.group_ranks, r.payload_bytes) for r in backward.records]
        res["grad"] = None if leaf.grad is None else leaf.grad.clone()
        out.append(res)
    return out


def check_reduce_scatter_to_sequence(cls: type) -> None:
    """ḡ on worlds of 2, 3 (tp = world) and 4 (tp groups of 2), two dtypes and layouts, then
    on a world of 3 where one rank's blocks are all zeros."""
    worlds = [(world, tp, None) for world, tp in SP_CASES] + [(SP_ZERO[0], SP_ZERO[0], SP_ZERO[1])]
    for world, tp, zero in worlds:
        hint = SP_HANG_HINT + (f" {SP_ZERO_HINT}" if zero is not None else "")
        try:
            results = run_on_world(_sp_rank, world, cls, tp, zero, hang_hint=hint)
        except RankFailedError as exc:
            extra = SP_ZERO_HINT if zero is not None else ""
            raise CheckFailed(_explain_crash(exc, world, tp, extra)) from None
        for rank, cases in enumerate(results):
            for res in cases:
                problem = (
                    _diagnose_forward(res, rank, world)
                    or _diagnose_backward(res, rank, world)
                    or _diagnose_ledger(res, rank, world)
                )
                if problem:
                    fail(problem)
    passed(
        "ḡ keeps this rank's block of the tp group's sum (one reduce-scatter, input "
        "untouched) and all-gathers the gradient blocks in backward, on worlds of 2, 3 and 4, "
        "for transposed and contiguous inputs, and with one rank's blocks all zeros"
    )
