"""A GPT whose MLPs are mixtures of experts, in one process and with its experts over ranks.

Switch Transformer (Fedus et al. 2022, section 2 and figure 2): every block's feed-forward
layer becomes E expert feed-forward layers (hidden -> 4·hidden -> hidden, the block's own
MLP shape) and a router; a token's output is its chosen experts' gated sum, and the aux loss
of every MoE layer is added to the language-model loss (section 2.2: α · Σ_layers aux).

- `moe_gpt(cfg, experts, k, capacity_factor, groups)`: the course GPT (`minidist.models`)
  with `MoEMLP`s in place of the MLPs; `groups` routes each layer's b·s tokens in that many
  contiguous groups, one per rank that will route them (the same capacity, the same drops).
- `ExpertParallelGPT(model, ep_group, dp_group, pad_to_capacity)`: each layer's experts
  placed over `ep_group` (`ExpertParallelMoE`), everything else replicated on every rank.
  Gradients: everything but the experts summed over the world in one flat all-reduce (the
  routers' included: data parallelism over every rank's tokens), the experts over `dp_group`
  (the ranks holding the same experts), in another: two calls per step.

Lesson 13's planner plans this model (`ModelSpec(..., experts=E)`, `Layout(ep=e)`).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn

from ..models import GPT, GPTConfig, require_course_gpt
from ..parallel import all_reduce_flat, broadcast_parameters, verify_same_model
from .moe import MoE
from .parallel import ExpertParallelMoE


class MoEMLP(nn.Module):
    """The block's MLP slot: x [b, s, h] -> the MoE of its b·s tokens, routed in `groups`
    groups (one process) or as this rank's one group (`ExpertParallelMoE`); keeps `aux`."""

    def __init__(self, moe: nn.Module, groups: int | None = 1):
        super().__init__()
        self.moe, self.groups = moe, groups
        self.aux: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        flat = x.reshape(b * s, h)
        y, self.aux = self.moe(flat) if self.groups is None else self.moe(flat, self.groups)
        return y.view(b, s, h)


def moe_gpt(
    cfg: GPTConfig,
    experts: int,
    k: int = 1,
    capacity_factor: float = 1.0,
    groups: int = 1,
    seed: int = 0,
) -> GPT:
    """The course GPT with every block's MLP an MoE of `experts` experts (layer i seeded
    `seed + i`), routing each layer's tokens in `groups` contiguous groups."""
    model = GPT(cfg)
    for i, block in enumerate(model.blocks):
        moe = MoE(cfg.hidden, 4 * cfg.hidden, experts, k, capacity_factor, seed=seed + i)
        block.mlp = MoEMLP(moe, groups)
    return model


def aux_loss(model: nn.Module) -> torch.Tensor:
    """Σ over the MoE layers of their last forward's aux loss (Switch section 2.2)."""
    return sum(m.aux for m in model.modules() if isinstance(m, MoEMLP))


def is_expert(name: str) -> bool:
    """Whether parameter `name` belongs to an expert (placed over ranks, not replicated)."""
    return ".experts." in name


class ExpertParallelGPT(nn.Module):
    """`model` (from `moe_gpt`) with each layer's experts over `ep_group` (E/e per rank, the
    rank's first ones at index r·E/e), the rest replicated; `forward(idx)` on this rank's
    sequences -> logits; `aux_loss()` the sum of this rank's layers' aux losses."""

    def __init__(self, model: GPT, ep_group=None, dp_group=None, pad_to_capacity: bool = True):
        super().__init__()
        require_course_gpt(model, "ExpertParallelGPT", "minidist.expert_parallel.moe_gpt")
        for block in model.blocks:  # bad input first, before any collective
            if not isinstance(block.mlp, MoEMLP):
                got = type(block.mlp).__name__
                raise ValueError(
                    "ExpertParallelGPT: model must come from moe_gpt (every "
                    f"block's mlp an MoEMLP), got {got}; for a model of your "
                    "own, use minidist.parallelize (lesson 17)"
                )
        verify_same_model(model, None, "ExpertParallelGPT", {"pad_to_capacity": pad_to_capacity})
        broadcast_parameters(model)  # ranks seeded differently still start from one model
        self.module = copy.deepcopy(model)
        for block in self.module.blocks:
            moe = ExpertParallelMoE(block.mlp.moe, ep_group, dp_group, pad_to_capacity)
            block.mlp = MoEMLP(moe, None)
        self.ep_group, self.dp_group = ep_group, dp_group

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.module(idx)

    def aux_loss(self) -> torch.Tensor:
        return aux_loss(self.module)

    def reference_names(self) -> dict[str, str]:
        """{this module's parameter name: the one-process model's} (experts renumbered)."""
        out = {}
        for name, _ in self.module.named_parameters():
            out[name] = name
            if is_expert(name):
                head, rest = name.split(".experts.", 1)
                layer = self.module.get_submodule(head)  # ...mlp.moe
                i, tail = rest.split(".", 1)
                out[name] = f"{head}.experts.{layer.first + int(i)}.{tail}"
        return out

    def finish_gradient_sync(self) -> None:
        """Summed: the replicated parameters' gradients over every rank, the experts' over
        `dp_group` (each already holds every token of its expert-parallel group)."""
        named = [(n, p.grad) for n, p in self.module.named_parameters() if p.grad is not None]
        all_reduce_flat([g for n, g in named if not is_expert(n)], None, "ep dense grads")
        if self.dp_group is not None and dist.get_world_size(self.dp_group) > 1:
            all_reduce_flat([g for n, g in named if is_expert(n)], self.dp_group, "ep expert grads")


__all__ = ["MoEMLP", "moe_gpt", "aux_loss", "is_expert", "ExpertParallelGPT"]
