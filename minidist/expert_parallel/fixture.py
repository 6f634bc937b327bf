"""The rank functions lesson 16's notebook, tests and tour share.

One MoE layer (hidden 16, ffn 32, E = 8 experts) inside a residual, y = x + MoE(x), fitted
to a fixed random target with SGD: loss = mean squared error + alpha · aux. Each of the n
ranks routes its own group of `tokens` tokens; the reference is the same `MoE` in one
process with `groups = n` (the same groups, so the same capacity and the same drops).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .. import comm
from .moe import MoE
from .parallel import ExpertParallelMoE

SIZES = dict(hidden=16, ffn=32, num_experts=8)
TOKENS = 24  # per group (per rank)
LR = 0.1


def build(groups: int, k: int = 1, capacity_factor: float = 1.0, steps: int = 3,
          shift: float = 0.0, seed: int = 0):  # fmt: skip
    """(the MoE, [(x, target)] per step for `groups` groups of TOKENS tokens). `shift` adds
    a common direction to every token, which sends most of them to the same experts."""
    moe = MoE(**SIZES, k=k, capacity_factor=capacity_factor, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    h = SIZES["hidden"]
    mix = torch.randn(h, h, generator=g, device="cpu") / h**0.5
    common = torch.randn(h, generator=g, device="cpu")
    batches = []
    for _ in range(steps):
        x = torch.randn(groups * TOKENS, h, generator=g, device="cpu") + shift * common
        batches.append((x, torch.tanh(x @ mix)))
    return moe, batches


def _grad(p: torch.Tensor) -> torch.Tensor:
    """A copy of p's gradient; zeros for an expert that got no token."""
    return p.grad.clone() if p.grad is not None else torch.zeros_like(p)


class Step(NamedTuple):
    out: torch.Tensor  # the layer's MoE output (this rank's rows)
    aux: torch.Tensor  # [groups] each group's aux loss
    experts: torch.Tensor  # [T, k] chosen, one routing per group
    kept: torch.Tensor  # [T, k]
    grads: dict[str, torch.Tensor]  # reference names, and "input": the rows' gradient


def reference(groups: int, k: int = 1, capacity_factor: float = 1.0, steps: int = 3,
              alpha: float = 0.01, shift: float = 0.0):  # fmt: skip
    """The MoE in one process: per step a `Step` (rows of every group), final parameters."""
    moe, batches = build(groups, k, capacity_factor, steps, shift)
    opt = torch.optim.SGD(moe.parameters(), lr=LR)
    trace = []
    for x, target in batches:
        x = x.clone().requires_grad_()  # the layer's input: an earlier layer's output
        opt.zero_grad()
        y, aux = moe(x, groups)
        (F.mse_loss(x + y, target) + alpha * aux).backward()
        rs = moe.routings
        grads = {n: _grad(p) for n, p in moe.named_parameters()} | {"input": x.grad}
        trace.append(Step(y.detach(), torch.stack([r.aux.detach() for r in rs]),
                          torch.cat([r.experts for r in rs]), torch.cat([r.kept for r in rs]),
                          grads))  # fmt: skip
        opt.step()
    return trace, {n: p.detach().clone() for n, p in moe.named_parameters()}


class EPRun(NamedTuple):
    trace: list[Step]
    params: dict[str, torch.Tensor]  # this rank's, reference names
    records: list[comm.CommRecord]
    sent: list[list[int]]  # per step: kept assignments sent to each rank of the EP group
    router_params: int
    expert_params: int  # held by this rank


def groups_for(e: int) -> tuple:
    """(ep_group, dp_group) of this rank: EP groups are blocks of e ranks, DP groups take
    every e-th rank (the ranks that hold the same experts). Every rank creates all."""
    n, rank = dist.get_world_size(), dist.get_rank()
    if n % e:
        raise ValueError(f"groups_for: world {n} is not a multiple of e={e}")
    if e == n:
        return None, None
    mine = [None, None]
    for i in range(n // e):
        g = dist.new_group(list(range(i * e, (i + 1) * e)))
        mine[0] = g if rank // e == i else mine[0]
    for j in range(e):
        g = dist.new_group(list(range(j, n, e)))
        mine[1] = g if rank % e == j else mine[1]
    return mine[0], mine[1]


def train_on_rank(e: int, k: int = 1, capacity_factor: float = 1.0, steps: int = 3,
                  alpha: float = 0.01) -> EPRun:  # fmt: skip
    """On a rank: `ExpertParallelMoE` over EP groups of e ranks (× n/e data-parallel),
    trained on this rank's group of tokens like `reference`."""
    n, rank = dist.get_world_size(), dist.get_rank()
    moe, batches = build(n, k, capacity_factor, steps)
    ep_group, dp_group = groups_for(e)
    ep = ExpertParallelMoE(moe, ep_group, dp_group)
    names = {"router.weight": "router.weight"} | ep.expert_names()
    opt = torch.optim.SGD(ep.parameters(), lr=LR)
    trace, sent = [], []
    with comm.record() as ledger:
        for x, target in batches:
            xr, tr = x.chunk(n)[rank].clone().requires_grad_(), target.chunk(n)[rank]
            opt.zero_grad()
            y, aux = ep(xr)
            ((F.mse_loss(xr + y, tr) + alpha * aux) / n).backward()
            ep.finish_gradient_sync()
            r = ep.routing
            trace.append(Step(
                y.detach(), aux.detach().view(1), r.experts, r.kept,
                {names[m]: _grad(p) for m, p in ep.named_parameters()} | {"input": xr.grad},
            ))  # fmt: skip
            sent.append(ep.sent_rows)
            opt.step()
    params = {names[m]: p.detach().clone() for m, p in ep.named_parameters()}
    held = sum(p.numel() for p in ep.experts.parameters())
    return EPRun(trace, params, list(ledger.records), sent, ep.router.weight.numel(), held)


def send_matrix(runs: list[EPRun], e: int, step: int, block: int = 0) -> list[list[int]]:
    """send[i][j] of the EP group `block` (ranks block·e ... block·e + e - 1) at `step`."""
    return [runs[block * e + i].sent[step] for i in range(e)]


class BalanceRun(NamedTuple):
    first_choices: list[list[int]]  # per step: tokens whose first choice is each expert
    dropped: list[int]  # per step, over every group
    aux: list[float]  # per step, mean over the groups
    loss: list[float]  # per step, the squared error


def balance_run(alpha: float, steps: int = 60, shift: float = 1.0, groups: int = 4) -> BalanceRun:
    """The MoE (k = 1, capacity factor 1) in one process, trained `steps` steps on tokens
    that share a common direction (`shift`), with the aux loss weighted by `alpha`."""
    moe, batches = build(groups, 1, 1.0, steps, shift=shift)
    opt = torch.optim.SGD(moe.parameters(), lr=LR)
    run = BalanceRun([], [], [], [])
    for x, target in batches:
        opt.zero_grad()
        y, aux = moe(x, groups)
        loss = F.mse_loss(x + y, target)
        (loss + alpha * aux).backward()
        opt.step()
        first = torch.cat([r.experts[:, 0] for r in moe.routings])
        run.first_choices.append(torch.bincount(first, minlength=moe.num_experts).tolist())
        run.dropped.append(sum(int((~r.kept).sum()) for r in moe.routings))
        run.aux.append(float(aux.detach()))
        run.loss.append(float(loss.detach()))
    return run


def train_many(configs: list[tuple]) -> list[EPRun]:
    """On a rank: `train_on_rank(*config)` for each config, in one world."""
    return [train_on_rank(*c) for c in configs]
