"""The same models and global batches wherever they are built: notebook, tests, tour, checker.

`build("mlp" | "gpt", steps, global_batch, seed, **sizes)` returns the model, the *global*
batches and the loss, identical on every rank and in the parent for the same arguments.
Each model has a frozen parameter (`requires_grad=False`); the GPT's output head *is* its
token embedding (a tied parameter). A rank keeps only its slice of each batch
(`minidist.data.shard_batch`).

The rank functions below are what notebook 01, the tests and the tour run on a world:
`train_on_rank` (a DP technique trained on this rank's slices, with its ledger) and
`accumulate_on_rank` (gradient accumulation under `no_sync`); `reference` trains the same
model in one process. `TwoHeads` has a branch a forward may skip (an unused parameter).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from .. import comm
from ..data import CharTokenizer, lm_batches, make_corpus, regression_batches, shard_batch
from ..models import GPT, MLP, GPTConfig, MLPConfig, lm_loss
from ..runtime.device import rank_device
from ..training import TrainTrace, make_optimizer, train
from .bucketed import BucketedDataParallel
from .naive import NaiveDataParallel

STEPS = 5  # optimizer steps of the equivalence runs
MLP_SIZES = dict(in_dim=16, hidden=32, out_dim=4, layers=3)
GPT_SIZES = dict(seq_len=16, layers=2, heads=2, hidden=32)


class Fixture(NamedTuple):
    model: nn.Module
    batches: list[tuple[torch.Tensor, torch.Tensor]]
    loss_fn: object


def build(
    name: str, steps: int = STEPS, global_batch: int = 8, seed: int = 0, **sizes: int
) -> Fixture:
    """(model, global batches, loss_fn); `sizes` override the config (`MLP_SIZES`, `GPT_SIZES`)."""
    torch.manual_seed(seed)
    if name == "mlp":
        cfg = MLPConfig(**{**MLP_SIZES, **sizes})
        model = MLP(cfg).to(rank_device())  # a GPU rank's under NCCL, else the CPU
        model.layers[0].bias.requires_grad_(False)  # a frozen parameter
        batches = regression_batches(steps, global_batch, cfg.in_dim, cfg.out_dim, seed=seed)
        return Fixture(model, batches, F.mse_loss)
    if name == "gpt":
        text = make_corpus(200, seed=seed)
        tok = CharTokenizer(text)
        cfg = GPTConfig(vocab_size=tok.vocab_size, **{**GPT_SIZES, **sizes})
        model = GPT(cfg).to(rank_device())  # lm_head.weight is tok_emb.weight: tied
        model.ln_f.bias.requires_grad_(False)  # a frozen parameter
        batches = lm_batches(tok.encode(text), steps, global_batch, cfg.seq_len, seed=seed)
        return Fixture(model, batches, lm_loss)
    raise ValueError(f"build: name must be 'mlp' or 'gpt', got {name!r}")


def trainable_params(model: nn.Module) -> int:
    """Ψ: parameters that get a gradient (a tied weight once, frozen ones not)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def wrap(kind: str, model: nn.Module, **options) -> NaiveDataParallel | BucketedDataParallel:
    """`kind` "naive" or "bucketed"; `options` go to BucketedDataParallel."""
    if kind == "naive":
        return NaiveDataParallel(model)
    if kind == "bucketed":
        return BucketedDataParallel(model, **options)
    raise ValueError(f"wrap: kind must be 'naive' or 'bucketed', got {kind!r}")


def reference(name: str, optimizer: str = "sgd", **build_args) -> TrainTrace:
    """The same model trained in one process on the whole global batches."""
    model, batches, loss_fn = build(name, **build_args)
    return train(model, batches, loss_fn, make_optimizer(model.parameters(), optimizer))


def train_on_rank(
    kind: str,
    name: str,
    perturb: bool = False,
    build_args: dict | None = None,
    **options,
) -> tuple[TrainTrace, comm.Ledger, int]:
    """On a rank: train `kind` DP on this rank's slices; (trace, ledger, collectives per step).

    `perturb` gives every rank but 0 other starting parameters, which the wrapper's initial
    broadcast must undo. The ledger covers training only (not the initial broadcast).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build(name, **(build_args or {}))
    if perturb and rank != 0:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    wrapped = wrap(kind, model, **options)
    local = [shard_batch(b, rank, world) for b in batches]
    with comm.record() as ledger:
        trace = train(wrapped, local, loss_fn, make_optimizer(model.parameters()))
    return trace, ledger, len(ledger.records) // len(batches)


def accumulate_on_rank(
    micro_batches: int, name: str = "mlp", wrapper=BucketedDataParallel
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """On a rank: backward on `micro_batches` slices, all but the last under `no_sync()`.

    `wrapper(model)` is any ParallelModule with `no_sync` (DDP here, FSDP in lesson 03).
    Returns the accumulated gradients and the collectives recorded.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build(name, steps=micro_batches)
    ddp = wrapper(model)
    with comm.record() as ledger:
        for i, batch in enumerate(batches):
            x, y = shard_batch(batch, rank, world)
            if i < micro_batches - 1:
                with ddp.no_sync():
                    loss_fn(ddp(x), y).backward()
            else:
                loss_fn(ddp(x), y).backward()
    return ddp.full_grads(), ledger.ops()


def accumulated_reference(micro_batches: int, name: str = "mlp") -> dict[str, torch.Tensor]:
    """One process: the gradients summed over the same micro-batches."""
    model, batches, loss_fn = build(name, steps=micro_batches)
    for x, y in batches:
        loss_fn(model(x), y).backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


class TwoHeads(nn.Module):
    """`b` is used only when asked to: an unused parameter on some steps or ranks."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, use_b: bool) -> torch.Tensor:
        y = self.a(x)
        return y + self.b(x) if use_b else y


def unused_on_rank(use_b_on_ranks: tuple[int, ...], find_unused: bool) -> dict:
    """On a rank: one backward of `TwoHeads` using `b` only on `use_b_on_ranks`.

    Returns {name: gradient or None}.
    """
    torch.manual_seed(0)
    model = TwoHeads()
    ddp = BucketedDataParallel(model, find_unused_parameters=find_unused, first_bucket_cap_mb=1e-4)
    x = torch.randn(2, 4, device=next(model.parameters()).device) + dist.get_rank()
    ddp(x, dist.get_rank() in use_b_on_ranks).sum().backward()
    return {n: (None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()}
