"""The top-k router, capacity, dispatch order and auxiliary loss of a mixture of experts.

Switch Transformer (Fedus et al. 2022, JMLR, section 2.1-2.2: k = 1) and GShard (Lepikhin
et al. 2020, section 2.2 and Algorithm 1: k = 2), with the conventions minidist uses:

- probabilities p = softmax(x·W_r) over all E experts; each token picks its k largest.
- gates: k = 1, the chosen expert's probability p_e (Switch eq. 2, so the router learns
  from the task loss); k > 1, the chosen probabilities renormalised to sum to 1 (GShard's
  g1/(g1+g2)), that is the softmax over the k chosen logits.
- capacity C = ⌈capacity_factor · T · k / E⌉ per expert, T the tokens of one GROUP (GShard's
  per-group capacity): a rank's tokens when experts are placed over ranks.
- priority: every token's first choice before any second choice (GShard Algorithm 1), and
  within a choice in token order; an expert keeps its first C assignments, the rest are
  dropped: they add 0 to the layer's output, so the token passes on through the residual.
- auxiliary loss E · Σ_e f_e · P_e, f_e the fraction of the group's tokens whose FIRST choice
  is e (before dropping), P_e the mean probability of e over the group (Switch eq. 4-6).
  Uniform routing gives 1, everything on one expert E; no token at all gives 0.
- a token whose logits are not finite (a NaN or inf in the layer's input) is refused: it
  would be routed somewhere and shift the slots, so the drops, of every finite token.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch


class Routing(NamedTuple):
    experts: torch.Tensor  # [T, k] chosen expert ids
    gates: torch.Tensor  # [T, k] their weights (differentiable)
    kept: torch.Tensor  # [T, k] bool: within capacity
    slot: torch.Tensor  # [T, k] position in the expert's buffer (priority order)
    aux: torch.Tensor  # the group's auxiliary load-balancing loss (differentiable)
    capacity: int


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_routing_args(who: str, num_experts, k, capacity_factor) -> None:
    """num_experts and k ints with 1 <= k <= num_experts; capacity_factor a finite number > 0."""
    if not _is_int(num_experts) or not _is_int(k) or not 1 <= k <= num_experts:
        raise ValueError(f"{who}: need ints 1 <= k={k!r} <= num_experts={num_experts!r}")
    real = isinstance(capacity_factor, (int, float)) and not isinstance(capacity_factor, bool)
    if not (real and math.isfinite(capacity_factor) and capacity_factor > 0):
        raise ValueError(f"{who}: capacity_factor={capacity_factor!r} must be a finite number > 0")


def capacity(tokens: int, num_experts: int, k: int = 1, capacity_factor: float = 1.0) -> int:
    """C = ⌈capacity_factor · tokens · k / E⌉ (Switch eq. 3, GShard's per-group capacity)."""
    check_routing_args("capacity", num_experts, k, capacity_factor)
    return math.ceil(capacity_factor * tokens * k / num_experts)


def dispatch(expert: torch.Tensor, num_experts: int, capacity_factor: float = 1.0):
    """Top-1 dispatch: for each expert, (kept token indices, dropped token indices), both in
    token order; an expert keeps its first C = ⌈capacity_factor · T / E⌉ tokens."""
    c = capacity(expert.numel(), num_experts, 1, capacity_factor)
    out = []
    for e in range(num_experts):
        mine = torch.nonzero(expert == e).flatten()
        out.append((mine[:c], mine[c:]))
    return out


def load_balancing_loss(probs: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """E · Σ_e f_e · P_e: probs [T, E] (softmax of the router), first [T] first choices."""
    num_experts = probs.shape[-1]
    counts = torch.bincount(first, minlength=num_experts).to(probs.dtype)
    if first.numel() == 0:  # no token: f = P = 0, the loss 0 (not 0/0), still in the graph
        return probs.sum() * 0.0
    f = counts / first.numel()
    return num_experts * (f * probs.mean(0)).sum()


def route(logits: torch.Tensor, k: int = 1, capacity_factor: float = 1.0) -> Routing:
    """Route one group's tokens: logits [T, E] -> `Routing` (conventions in the docstring)."""
    if logits.dim() != 2:
        raise ValueError(f"route: logits must be [tokens, experts]; got {tuple(logits.shape)}")
    tokens, num_experts = logits.shape
    bad = ~torch.isfinite(logits.detach()).all(-1)  # (detached: abs() would save logits)
    if bool(bad.any()):  # a NaN would be routed somewhere and shift every later token's slot
        which = torch.nonzero(bad).flatten()[:8].tolist()
        raise ValueError(
            f"route: the router's logits of tokens {which} (of {tokens}) are not "
            "finite: a NaN or inf reached the MoE's input"
        )
    cap = capacity(tokens, num_experts, k, capacity_factor)
    probs = torch.softmax(logits, dim=-1)
    top, experts = probs.topk(k, dim=-1)  # ties: torch.topk's order, the same on every rank
    gates = top if k == 1 else top / top.sum(-1, keepdim=True)
    # priority: choice j of every token before choice j+1, tokens in order within a choice
    order = experts.t().reshape(-1)  # [k·T]: (choice, token)
    onehot = torch.nn.functional.one_hot(order, num_experts)
    slot = ((onehot.cumsum(0) - 1) * onehot).sum(-1).view(k, tokens).t()
    return Routing(experts, gates, slot < cap, slot, load_balancing_loss(probs, experts[:, 0]), cap)


def tokens_per_expert(r: Routing, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(assignments kept, assignments dropped) per expert."""
    kept = torch.bincount(r.experts[r.kept], minlength=num_experts)
    dropped = torch.bincount(r.experts[~r.kept], minlength=num_experts)
    return kept, dropped
