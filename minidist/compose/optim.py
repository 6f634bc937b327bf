"""The optimizer a run needs on the composed engine: Adam or AdamW with weight decay, a
learning-rate schedule, and gradient clipping by the global norm over every rank's share.

- **Weight decay** only on parameters with two or more dimensions (matmul weights and
  embeddings, the tied one included); none on norms' weights and biases (ndim < 2), as
  nanoGPT's `configure_optimizers` and torchtitan's default. `adamw` decays decoupled
  (Loshchilov & Hutter 2019: p ← p·(1 − lr·wd), then Adam); `adam` adds wd·p to the
  gradient (L2), as `torch.optim.Adam(weight_decay=)`. On the engine the inner optimizer
  steps one flat ZeRO chunk, so the decay is applied to the chunk's ranges that belong to a
  decayed parameter (`ShardAdam`), with the very operations torch's Adam uses.
- **Schedule** (`lr_factor`): linear warm-up over `warmup` steps, (step + 1) / (warmup + 1)
  as nanoGPT and torchtitan, then constant, cosine or linear decay from `lr` to `min_lr`
  at the last step. The engine sets `lr · factor` before each step; one process gets the
  same numbers from `torch.optim.lr_scheduler.LambdaLR`.
- **Clipping** (`clip_grad_norm_`): the 2-norm of the whole gradient, as
  `torch.nn.utils.clip_grad_norm_` in one process, from each rank's reduced ZeRO chunk:
  squares summed over the pieces a rank owns (`grad_pieces`: a tensor-parallel shard by its
  box, a copy replicated over tp, dp_replicate or the tied embedding's stages counted once),
  one all-reduce over the world, then every rank scales its chunk by
  min(1, max_norm / (norm + 1e-6)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from .. import comm

OPTIMIZERS = ("adam", "adamw")
LR_SCHEDULES = ("constant", "cosine", "linear")


@dataclass(frozen=True)
class OptimizerConfig:
    """What the run's optimizer does; `check(steps)` refuses a bad one in words."""

    optimizer: str = "adam"
    lr: float = 1e-2
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup: int = 0
    lr_schedule: str = "constant"
    min_lr: float = 0.0
    clip_grad: float | None = None

    def check(self, steps: int) -> OptimizerConfig:
        """Self, or ValueError naming the option (CLI spelling) and the rule it broke."""
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"--optimizer={self.optimizer!r} must be one of {OPTIMIZERS}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"--lr-schedule={self.lr_schedule!r} must be one of {LR_SCHEDULES}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"--lr={self.lr} must be > 0 and finite")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"--min-lr={self.min_lr} must be in [0, --lr={self.lr}]")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"--weight-decay={self.weight_decay} must be >= 0 and finite")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            betas = ",".join(str(b) for b in self.betas)
            raise ValueError(f"--betas={betas} must be two numbers B1,B2, each in [0, 1)")
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise ValueError(f"--eps={self.eps} must be a finite number > 0")
        if not 0 <= self.warmup < steps:
            raise ValueError(f"--warmup={self.warmup} must be >= 0 and < --steps={steps}")
        if self.clip_grad is not None and not (
            math.isfinite(self.clip_grad) and self.clip_grad > 0
        ):
            raise ValueError(f"--clip-grad={self.clip_grad} must be > 0 and finite")
        return self

    def lr_at(self, step: int, steps: int) -> float:
        """The learning rate of step `step` (0-based) of `steps`."""
        return self.lr * lr_factor(
            step, steps, self.warmup, self.lr_schedule, self.min_lr / self.lr
        )


def lr_factor(step: int, steps: int, warmup: int, schedule: str, min_ratio: float) -> float:
    """lr(step) / lr: warm-up (step + 1) / (warmup + 1), then the schedule's decay from 1 at
    step `warmup` to `min_ratio` at step `steps - 1`."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, steps - 1 - warmup)
    decay = 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1 - progress
    return min_ratio + (1 - min_ratio) * decay


def decays(p: torch.Tensor) -> bool:
    """Whether weight decay applies to `p`: matrices and embeddings, not norms or biases."""
    return p.dim() >= 2


class ShardAdam(torch.optim.Adam):
    """Adam on one flat ZeRO chunk whose weight decay touches only `ranges` (the chunk's
    slices of decayed parameters): decoupled (AdamW) or added to the gradient (L2)."""

    def __init__(self, params, ranges, weight_decay: float, decoupled: bool, **defaults):
        super().__init__(params, weight_decay=0.0, **defaults)
        self.ranges, self.decay, self.decoupled = ranges, weight_decay, decoupled

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None or not self.decay:
                    continue
                for lo, hi in self.ranges:  # torch's `_single_tensor_adam`, one range each
                    if self.decoupled:
                        p[lo:hi].mul_(1 - group["lr"] * self.decay)
                    else:
                        p.grad[lo:hi].add_(p[lo:hi], alpha=self.decay)
        return super().step(closure)


def shard_optimizer(zero, cfg: OptimizerConfig) -> ShardAdam:
    """`zero.inner` for `cfg`: Adam on the chunk `zero.shard`, decaying the ranges of its
    parameters with ndim ≥ 2 (`zero.layout`'s offsets, clipped to this rank's chunk)."""
    lay, ranges = zero.layout, []
    for p, off, n in zip(zero.params, lay.offsets, lay.numels):
        lo, hi = max(off, lay.start), min(off + n, lay.start + lay.chunk)
        if decays(p) and lo < hi:
            ranges.append((lo - lay.start, hi - lay.start))
    return ShardAdam(
        [zero.shard],
        ranges,
        cfg.weight_decay,
        cfg.optimizer == "adamw",
        lr=cfg.lr,
        betas=cfg.betas,
        eps=cfg.eps,
    )


def set_lr(engine, lr: float) -> None:
    """Every inner optimizer of `engine` steps with `lr` next."""
    for _, opt in engine.optimizers:
        for group in opt.inner.param_groups:
            group["lr"] = lr


@torch.no_grad()
def clip_grad_norm_(engine, max_norm: float) -> float:
    """After `finish_gradient_sync`: the whole gradient's 2-norm (every rank gets it), and
    each rank's chunk scaled by min(1, max_norm / (norm + 1e-6)), as torch's."""
    chunks = [opt.shard.grad for _, opt in engine.optimizers if opt.shard.grad is not None]
    device = comm.group_device(None)  # the chunks may be on the host (offloaded)
    squares = torch.zeros((), dtype=torch.float64, device=device)
    for q in engine.grad_pieces():
        if q.owner:
            squares += q.tensor.double().pow(2).sum().to(device)
    comm.all_reduce(squares, tag="clip-grad-norm")  # over the world: every kind of share
    norm = squares.sqrt().float()
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in chunks:
        g.mul_(coef.to(g.device))
    return float(norm)


def torch_optimizer(model: nn.Module, cfg: OptimizerConfig, steps: int):
    """The one-process run's optimizer and scheduler: torch's Adam or AdamW with two groups
    (decayed and not) and `LambdaLR` on `lr_factor`; clip with `clip_grad_norm_`."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if decays(p)], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if not decays(p)], "weight_decay": 0.0},
    ]
    kind = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    opt = kind([g for g in groups if g["params"]], lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    ratio = cfg.min_lr / cfg.lr
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: lr_factor(step, steps, cfg.warmup, cfg.lr_schedule, ratio)
    )
    return opt, schedule


def engine_options(cfg: OptimizerConfig) -> dict:
    """`parallelize`'s optimizer keywords for `cfg` (the schedule and clipping are the
    loop's: `set_lr`, `clip_grad_norm_`)."""
    return dict(
        lr=cfg.lr,
        optimizer=cfg.optimizer,
        weight_decay=cfg.weight_decay,
        betas=cfg.betas,
        eps=cfg.eps,
    )
