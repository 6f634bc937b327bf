"""Lesson 07, exercise 2, on a tp group that is not the world: 4 ranks as two groups of 2.

A cross entropy whose all-reduces forget `group=` sums over the whole world; on 2 or 3
ranks the group is the world and nothing shows. Here it does: the ledger's group and the
loss both give it away.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ... import comm
from ...course.check import fail, run_on_world
from ...runtime import RankFailedError
from ..layout import ParallelLayout


def _ce_group_rank(fn: Callable, logits, targets, per: int, vocab: int) -> dict:
    """One case on a tp group of 2 inside a world of 4: the group is not the world."""
    layout = ParallelLayout(tp=2)
    q = layout.tp_rank
    with comm.record() as ledger:
        loss = fn(
            logits[:, q * per : (q + 1) * per].clone(),
            targets.clone(),
            layout.group("tp"),
            q * per,
            vocab,
        )
    return dict(
        value=float(loss.detach()) if isinstance(loss, torch.Tensor) else None,
        groups={r.group_ranks for r in ledger.records},
        tp=tuple(layout.mine["tp"]),
    )


def check_group_case(
    fn: Callable, inputs: tuple, vocab: int, right: float, crash: Callable, hang_hint: str
) -> None:
    """`fn` on two tp groups of 2 in a world of 4 (`inputs` = (logits, targets, padded,
    columns per rank) of a 2-rank case whose loss is `right`): each rank's loss, and each
    collective's group, must be its tp group's. `crash(exc)` explains a rank's exception."""
    logits, targets, _, per = inputs
    try:
        grouped = run_on_world(
            _ce_group_rank, 4, fn, logits, targets, per, vocab, hang_hint=hang_hint
        )
    except RankFailedError as exc:
        fail(crash(exc))
    for rank, res in enumerate(grouped):
        wrong_group = [g for g in res["groups"] if g != res["tp"]]
        value_off = res["value"] is None or not math.isclose(res["value"], right, rel_tol=1e-4)
        if wrong_group or value_off:
            fail(
                f"on 4 ranks as two tp groups of 2, rank {rank} (tp group {list(res['tp'])}) "
                f"made collectives over ranks {sorted(map(list, res['groups']))}"
                f" and returned {res['value']} (want {right:.6g}): pass group=group to every "
                "comm.all_reduce; the other tp group holds another copy of the vocabulary."
            )
