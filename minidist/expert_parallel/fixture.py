"""The rank functions lesson 16's notebook, tests and tour share.

The MoE GPT (`gpt.py`, last section): lesson 01's GPT sizes with every MLP an MoE of 4
experts (top-2, capacity factor 1), trained on random tokens; `gpt_train_on_rank` places the
experts over ranks (EP × DP), `gpt_reference` is the same model in one process.

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
from ..data import shard_batch
from ..memory import ModelStateBytes, model_state_bytes
from ..models import GPTConfig, lm_loss
from ..runtime.device import rank_device
from ..training import make_optimizer
from .gpt import ExpertParallelGPT, aux_loss, moe_gpt
from .moe import MoE
from .parallel import ExpertParallelMoE

SIZES = dict(hidden=16, ffn=32, num_experts=8)
TOKENS = 24  # per group (per rank)
LR = 0.1


def build(
    groups: int,
    k: int = 1,
    capacity_factor: float = 1.0,
    steps: int = 3,
    shift: float = 0.0,
    seed: int = 0,
):
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


def reference(
    groups: int,
    k: int = 1,
    capacity_factor: float = 1.0,
    steps: int = 3,
    alpha: float = 0.01,
    shift: float = 0.0,
):
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
        trace.append(
            Step(
                y.detach(),
                torch.stack([r.aux.detach() for r in rs]),
                torch.cat([r.experts for r in rs]),
                torch.cat([r.kept for r in rs]),
                grads,
            )
        )
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
        g = comm.new_group(range(i * e, (i + 1) * e), "ep")
        mine[0] = g if rank // e == i else mine[0]
    for j in range(e):
        g = comm.new_group(range(j, n, e), "expert dp")
        mine[1] = g if rank % e == j else mine[1]
    return mine[0], mine[1]


def train_on_rank(
    e: int,
    k: int = 1,
    capacity_factor: float = 1.0,
    steps: int = 3,
    alpha: float = 0.01,
    pad_to_capacity: bool = False,
) -> EPRun:
    """On a rank: `ExpertParallelMoE` over EP groups of e ranks (× n/e data-parallel),
    trained on this rank's group of tokens like `reference` (padded to capacity or not)."""
    n, rank = dist.get_world_size(), dist.get_rank()
    moe, batches = build(n, k, capacity_factor, steps)
    device = rank_device()  # a GPU rank's under NCCL, else the CPU
    moe.to(device)
    ep_group, dp_group = groups_for(e)
    ep = ExpertParallelMoE(moe, ep_group, dp_group, pad_to_capacity)
    names = {"router.weight": "router.weight"} | ep.expert_names()
    opt = torch.optim.SGD(ep.parameters(), lr=LR)
    trace, sent = [], []
    with comm.record() as ledger:
        for x, target in batches:
            xr = x.chunk(n)[rank].to(device).clone().requires_grad_()
            tr = target.chunk(n)[rank].to(device)
            opt.zero_grad()
            y, aux = ep(xr)
            ((F.mse_loss(xr + y, tr) + alpha * aux) / n).backward()
            ep.finish_gradient_sync()
            r = ep.routing
            trace.append(
                Step(
                    y.detach(),
                    aux.detach().view(1),
                    r.experts,
                    r.kept,
                    {names[m]: _grad(p) for m, p in ep.named_parameters()} | {"input": xr.grad},
                )
            )
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


# -- the MoE GPT (`gpt.py`): EP × DP on a whole model ---------------------------------------

MOE_GPT = dict(vocab_size=32, seq_len=16, layers=2, heads=2, hidden=32)
GPT_MOE = dict(experts=4, k=2, capacity_factor=1.0)  # E = 4 experts per layer, top-2
GPT_BATCH, GPT_STEPS, ALPHA = 8, 3, 0.01


def build_gpt(groups: int, steps: int = GPT_STEPS):
    """(`moe_gpt` of MOE_GPT routing in `groups` groups, [(ids, targets)] global batches of
    GPT_BATCH random sequences), the same on every rank."""
    torch.manual_seed(0)
    model = moe_gpt(GPTConfig(**MOE_GPT), **GPT_MOE, groups=groups).to(rank_device())
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(steps):
        ids = torch.randint(
            0, MOE_GPT["vocab_size"], (GPT_BATCH, MOE_GPT["seq_len"] + 1), generator=g, device="cpu"
        )
        batches.append((ids[:, :-1], ids[:, 1:]))
    return model, batches


class GPTRun(NamedTuple):
    losses: list[float]  # this rank's (its sequences' mean); the reference's in one process
    params: dict[str, torch.Tensor]  # after training, the one-process model's names
    records: list[comm.CommRecord]
    memory: ModelStateBytes


def gpt_reference(groups: int) -> GPTRun:
    """The MoE GPT in one process on the whole batches (each layer routing `groups` groups),
    SGD + momentum on lm loss + ALPHA · Σ aux."""
    model, batches = build_gpt(groups)
    opt = make_optimizer(model.parameters())
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = lm_loss(model(x), y) + ALPHA * aux_loss(model)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return GPTRun(losses, params, [], model_state_bytes(model, opt))


def gpt_train_on_rank(e: int, pad_to_capacity: bool = True) -> GPTRun:
    """On a rank: `ExpertParallelGPT` over EP groups of e ranks × n/e data-parallel, trained
    on this rank's slice of every batch like `gpt_reference(n)`."""
    n, rank = dist.get_world_size(), dist.get_rank()
    model, batches = build_gpt(n)
    ep_group, dp_group = groups_for(e)
    ep = ExpertParallelGPT(model, ep_group, dp_group, pad_to_capacity)
    opt = make_optimizer(ep.parameters())
    losses = []
    with comm.record() as ledger:
        for batch in batches:
            x, y = shard_batch(batch, rank, n)
            opt.zero_grad()
            loss = lm_loss(ep(x), y) + ALPHA * ep.aux_loss()
            (loss / n).backward()  # the global loss is the mean of the ranks'
            ep.finish_gradient_sync()
            opt.step()
            losses.append(loss.item())
    names = ep.reference_names()
    params = {names[m]: p.detach().cpu().clone() for m, p in ep.module.named_parameters()}
    return GPTRun(losses, params, list(ledger.records), model_state_bytes(ep, opt))
