"""The mixture-of-experts layer in one process: the reference the parallel layer must equal.

Switch Transformer (Fedus et al. 2022, section 2.1) and GShard (Lepikhin et al. 2020,
section 2.2): a router picks k of E expert MLPs per token, the chosen experts' outputs are
summed weighted by the gates, and a token over an expert's capacity gets 0 from it (the
residual carries it on). Routing and capacity are per GROUP of tokens (`routing.py`): the
reference splits its tokens into `groups` equal contiguous groups, as many as the ranks
that route them, and loops over the experts densely.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .routing import Routing, check_routing_args, route


class Expert(nn.Module):
    """One expert: the transformer's MLP, hidden -> ffn -> hidden with a GELU."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class MoE(nn.Module):
    """Router W_r [h, E] (no bias) and E experts; `forward(x, groups)` -> (output, aux)."""

    def __init__(
        self,
        hidden: int,
        ffn: int,
        num_experts: int,
        k: int = 1,
        capacity_factor: float = 1.0,
        seed: int = 0,
    ):
        super().__init__()
        check_routing_args("MoE", num_experts, k, capacity_factor)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.router = nn.Linear(hidden, num_experts, bias=False)
            self.experts = nn.ModuleList(Expert(hidden, ffn) for _ in range(num_experts))
        self.num_experts, self.k, self.capacity_factor = num_experts, k, capacity_factor
        self.routings: list[Routing] = []

    def route(self, x: torch.Tensor) -> Routing:
        return route(self.router(x), self.k, self.capacity_factor)

    def forward(self, x: torch.Tensor, groups: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, h] -> (the experts' weighted sum [T, h], the mean of the groups' aux losses);
        the groups' routings are kept in `self.routings`."""
        if x.dim() != 2 or x.shape[0] % groups:
            raise ValueError(
                f"MoE: x must be [tokens, hidden] with tokens divisible by "
                f"groups={groups}; got {tuple(x.shape)}"
            )
        outs, auxes, self.routings = [], [], []
        for xg in x.chunk(groups):
            r = self.route(xg)
            y = torch.zeros_like(xg)
            for e, expert in enumerate(self.experts):
                t, j = torch.nonzero((r.experts == e) & r.kept, as_tuple=True)
                if t.numel():
                    y = y.index_add(0, t, expert(xg[t]) * r.gates[t, j, None])
            outs.append(y)
            auxes.append(r.aux)
            self.routings.append(r)
        return torch.cat(outs), torch.stack(auxes).mean()
