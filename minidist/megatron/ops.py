"""The communication of tensor parallelism as autograd Functions: f, g, scatter, gather.

Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion Parameter Language Models Using
Model Parallelism", section 3, Figure 3: a tensor-parallel region starts with f (identity in
forward, all-reduce of the input gradient in backward) and ends with g (all-reduce of the
partial outputs in forward, identity in backward); f and g are conjugate. `scatter_last` /
`gather_last` split or join the last dimension across the group (each the other's backward).
All collectives go through `minidist.comm`, so the ledger shows where each one happens.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import comm


class _CopyToTP(torch.autograd.Function):  # f
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        comm.all_reduce(grad, group=ctx.group, tag="tp-f-backward")
        return grad, None


class _ReduceFromTP(torch.autograd.Function):  # g
    @staticmethod
    def forward(ctx, x, group):
        out = x.contiguous().clone()
        comm.all_reduce(out, group=group, tag="tp-g-forward")
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _split_last(x: torch.Tensor, group) -> torch.Tensor:
    n, r = dist.get_world_size(group), dist.get_rank(group)
    if x.shape[-1] % n:
        raise ValueError(f"last dimension {x.shape[-1]} is not divisible by the tp size {n}")
    return x.chunk(n, dim=-1)[r].contiguous()


def _gather_last(x: torch.Tensor, group, tag: str) -> torch.Tensor:
    n = dist.get_world_size(group)
    x = x.contiguous()
    out = torch.empty(n * x.numel(), dtype=x.dtype, device=x.device)
    comm.all_gather(out, x.reshape(-1), group=group, tag=tag)
    return torch.cat(out.view(n, *x.shape).unbind(0), dim=-1)


class _ScatterLast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_last(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_last(grad, ctx.group, "tp-scatter-backward"), None


class _GatherLast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_last(x, group, "tp-gather-forward")

    @staticmethod
    def backward(ctx, grad):
        return _split_last(grad, ctx.group), None


def copy_to_tp(x: torch.Tensor, group) -> torch.Tensor:
    """f: identity forward, all-reduce of the gradient backward."""
    return _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group) -> torch.Tensor:
    """g: all-reduce forward, identity backward."""
    return _ReduceFromTP.apply(x, group)


def scatter_last(x: torch.Tensor, group) -> torch.Tensor:
    """This rank's 1/t of the last dimension; backward all-gathers the gradient."""
    return _ScatterLast.apply(x, group)


def gather_last(x: torch.Tensor, group) -> torch.Tensor:
    """Every rank's part joined along the last dimension; backward keeps this rank's part."""
    return _GatherLast.apply(x, group)
