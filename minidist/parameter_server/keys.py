"""Who owns which keys, who is a server: the parameter server's layout as arithmetic.

As in Li et al. 2014 (section 3.1, key ranges), the trainable parameters are one flat vector
of Ψ keys (in `named_parameters()` order, a tied parameter once, frozen ones left out) and
server k owns the contiguous range [k·⌈Ψ/S⌉, min((k+1)·⌈Ψ/S⌉, Ψ)). Ranks 0..S-1 are the
servers, ranks S..S+W-1 the workers; worker w trains on slice w of each global batch.
"""

from __future__ import annotations

import torch
import torch.nn as nn


def check_roles(world_size: int, servers: int, workers: int) -> None:
    """Raise unless S >= 1, W >= 1 and S + W is the world size."""
    for name, value in (("servers", servers), ("workers", workers)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"parameter server: {name} must be an int >= 1, got {value!r}")
    if servers + workers != world_size:
        raise ValueError(
            f"parameter server: servers={servers} + workers={workers} = {servers + workers} "
            f"ranks, but world_size={world_size}"
        )


def key_ranges(psi: int, servers: int) -> list[tuple[int, int]]:
    """[start, stop) of the keys each server owns: ⌈Ψ/S⌉ each, the last shorter."""
    if not isinstance(servers, int) or servers < 1:
        raise ValueError(f"key_ranges: servers must be an int >= 1, got {servers!r}")
    if servers > psi:
        raise ValueError(f"key_ranges: servers={servers} > Ψ={psi} keys: a server would own none")
    per = -(-psi // servers)
    return [(k * per, min((k + 1) * per, psi)) for k in range(servers)]


def owner(key: int, ranges: list[tuple[int, int]]) -> int:
    """The server that owns `key`."""
    for server, (start, stop) in enumerate(ranges):
        if start <= key < stop:
            return server
    raise KeyError(f"owner: key={key} is outside every server's range {ranges}")


def trainable(model: nn.Module) -> list[nn.Parameter]:
    """The parameters that have keys: trainable ones, each once, in registration order."""
    return [p for p in model.parameters() if p.requires_grad]


def flat_values(model: nn.Module) -> torch.Tensor:
    """The Ψ keys' values (a copy)."""
    return torch.cat([p.detach().reshape(-1) for p in trainable(model)])


def flat_grads(model: nn.Module) -> torch.Tensor:
    """The Ψ keys' gradients (zeros for a parameter without one)."""
    return torch.cat(
        [
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
            for p in trainable(model)
        ]
    )


def write_values(model: nn.Module, values: torch.Tensor) -> None:
    """Copy the Ψ keys' `values` into the model's trainable parameters."""
    offset = 0
    with torch.no_grad():
        for p in trainable(model):
            p.copy_(values[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
