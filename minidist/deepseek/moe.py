"""DeepSeekMoE's balancing (DeepSeek-V3 §2.1.2): the auxiliary-loss-free bias update, the
sequence-wise balance loss, node-limited routing measured.

A transformers `DeepseekV3TopkRouter` already routes as the paper: sigmoid affinities s, a
bias b added for the choice only (`e_score_correction_bias`: the top-K of s + b, the gates
from s), and group-limited routing: the experts in `n_group` groups, a token choosing among
the `topk_group` groups with the highest sum of their top-2 s + b. A group being a node,
that is node-limited routing (V3: 256 experts in n_group = 8 groups, a token's K_r = 8
experts on at most M = topk_group = 4 of them): the top-2 sum is the paper's "sum of the
K_r/M highest affinities" with K_r/M = 8/4 = 2.

Here: `count_expert_load(model)` counts, per MoE layer, the tokens routed to each expert in
the step (forward hooks on the routers, in place), `update_routing_bias(model, γ, group)`
moves each bias by γ against the sign of its expert's global load minus the mean (eq. 16's
rule, after each optimizer step). Not here: the paper's γ schedule (0.001, then 0 for the
last 500B tokens), the loss wired into a trainer.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import comm

BIAS = "e_score_correction_bias"


def routers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every router of `model` that has a selection bias, in module order
    (the same on every rank that holds the same layers)."""
    return [
        (n, m) for n, m in model.named_modules() if isinstance(getattr(m, BIAS, None), torch.Tensor)
    ]


def _count(router: nn.Module, inputs, output) -> None:
    # evaluation (eval mode) is not routing the step's tokens; a recomputed forward counts
    # twice, harmless: sign(2·load − 2·mean) = sign(load − mean)
    if router.training:
        chosen = output[-1].reshape(-1)  # (logits, weights, top-k indices)
        router.expert_load += torch.bincount(chosen, minlength=router.expert_load.numel())


def count_expert_load(model: nn.Module, required: bool = True) -> int:
    """Attach to every router of `model` (in place, once) a count of the tokens routed to
    each expert (`router.expert_load`, int64 [E]); how many routers. ValueError if none and
    `required` (a pipeline stage of only dense layers has none)."""
    found = routers(model)
    if not found and required:
        raise ValueError(
            f"count_expert_load: {type(model).__name__} has no router with an "
            f"{BIAS} (a DeepSeek-V3 MoE layer)"
        )
    for _, router in found:
        if not hasattr(router, "expert_load"):
            # float32 (the router adds it to float32 scores): a bf16 model (lesson 12) would
            # round a 0.001 step away once the bias is past 0.25 (8 bits of mantissa)
            setattr(router, BIAS, getattr(router, BIAS).float())
            bias = getattr(router, BIAS)
            router.expert_load = torch.zeros(bias.numel(), dtype=torch.int64, device=bias.device)
            router.register_forward_hook(_count)
    return len(found)


def load_group(engine: nn.Module):
    """The group over which a composed engine's (lesson 17) routers see different tokens:
    dp_replicate × dp_shard × cp of the stage (ep lies inside dp_shard × cp; tp ranks route
    the same tokens; each pipeline stage holds its own layers); None for one rank."""
    grid = getattr(engine, "grid", None)
    if grid is None or grid.size("dp_cp") == 1:
        return None
    return grid.group("dp_cp")


def bias_step(bias: torch.Tensor, load: torch.Tensor, speed: float) -> torch.Tensor:
    """b − γ·sign(load − mean load): an overloaded expert's bias goes down, an underloaded
    one's up, one at the mean stays (sign 0). A new tensor."""
    load = load.to(torch.float64)
    return bias - speed * torch.sign(load - load.mean()).to(bias.dtype)


@torch.no_grad()
def update_routing_bias(model: nn.Module, speed: float, group=None) -> dict[str, torch.Tensor]:
    """After an optimizer step: every router's bias moved by `bias_step` on its GLOBAL load
    (the counts summed over `group`, the ranks that routed other tokens of the same layers),
    the counts reset; {router name: its global load}."""
    found = routers(model)
    if not found:  # a stage of dense layers: the ranks of `group` hold none either
        return {}
    if not all(hasattr(r, "expert_load") for _, r in found):
        raise ValueError("update_routing_bias: call count_expert_load(model) first")
    loads = torch.stack([r.expert_load for _, r in found])  # one all-reduce for all layers
    if group is not None:
        comm.all_reduce(loads, group=group, tag="moe-load")
    out = {}
    for (name, router), load in zip(found, loads):
        bias = getattr(router, BIAS)
        bias.copy_(bias_step(bias.float(), load, speed))
        router.expert_load.zero_()
        out[name] = load.cpu()
    return out


def sequence_balance_loss(scores: torch.Tensor, chosen: torch.Tensor, alpha: float) -> torch.Tensor:
    """Eq. 17-20: α Σ_i f_i P_i per sequence, the mean over sequences. scores [B, T, E] the
    affinities s (sigmoid), chosen [B, T, K] the routed experts; f_i = E/(K·T) · (tokens of
    the sequence choosing i), P_i = the mean over its tokens of s_i / Σ_j s_j. A balanced
    sequence gives α."""
    _, t, e = scores.shape
    k = chosen.shape[-1]
    picks = F.one_hot(chosen, e).sum(dim=(1, 2)).to(scores.dtype)  # [B, E]
    f = picks * e / (k * t)
    p = (scores / scores.sum(-1, keepdim=True)).mean(1)
    return alpha * (f * p).sum(-1).mean()


def nodes_per_token(chosen: torch.Tensor, experts_per_node: int) -> torch.Tensor:
    """How many nodes each token's chosen experts (chosen [..., K]) span, experts placed in
    consecutive blocks of `experts_per_node` (node n: experts [n·per, (n+1)·per))."""
    nodes = torch.div(chosen, experts_per_node, rounding_mode="floor")
    ordered = nodes.sort(-1).values
    return 1 + (ordered[..., 1:] != ordered[..., :-1]).sum(-1)


def load_over_steps(speed: float, steps: int = 40, seed: int = 0, experts: int = 8) -> torch.Tensor:
    """The lesson's picture as data: [steps, MoE layers, experts] tokens routed per expert
    when a tiny transformers DeepSeek-V3 (2 MoE layers, top-2 of `experts` in 4 groups, 2
    chosen) trains on random tokens, its bias updated at `speed` (0: never). Measured (30
    steps, max/mean load over the last 10): 2.2 at speed 0, 1.5 at 0.01."""
    from .fixture import tiny_deepseek_v3

    model = tiny_deepseek_v3(
        seed,
        vocab_size=64,
        num_hidden_layers=3,
        n_routed_experts=experts,
        max_position_embeddings=32,
    )
    count_expert_load(model)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        ids = torch.randint(0, model.config.vocab_size, (16, 32), generator=g, device="cpu")
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        out.append(torch.stack(list(update_routing_bias(model, speed).values())))
    return torch.stack(out)
