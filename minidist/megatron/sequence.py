"""Sequence parallelism's communication as autograd Functions (lesson 14).

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
section 4.2.2 and Figure 5: outside the tensor-parallel regions (layer norms, dropouts,
residual adds) the activations are split along the sequence instead of being replicated.
The all-reduce g that ends a region becomes a reduce-scatter into the sequence-parallel
region (ḡ), and the identity f that starts one becomes an all-gather out of it (g): the
same bytes, (t-1)/t + (t-1)/t = 2(t-1)/t of the activation per rank.

Tensors are [batch, sequence, hidden]; the sequence (dim 1) splits in t equal blocks, rank r
holding block r. `linear_with_sequence_gather` is the column-parallel Linear of a region's
start: it gathers the sequence, multiplies, and saves only this rank's block of its input;
backward gathers it again for the weight gradient (the extra all-gather of section 4.2.2
that keeps the layer norm's output stored 1/t) and reduce-scatters the input gradient;
split into B and W (lesson 09's zero bubble), B gathers and W computes from what B kept
(the whole input, t blocks, held from B to W).
Every collective goes through `minidist.comm`, with a tag naming where it runs.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import comm


def check_sequence(seq: int, group) -> int:
    """The block length s/t; a sequence that does not divide by t is refused."""
    n = dist.get_world_size(group)
    if seq % n:
        raise ValueError(
            f"sequence parallelism: the sequence length {seq} is not divisible by tp={n} "
            "(every rank holds an equal block of the sequence)"
        )
    return seq // n


def _dim(x: torch.Tensor) -> int:
    """The sequence's dim: 1 of [b, s, h]; 0 of the [b·s, h] rows a module that flattens
    the tokens passes on (Qwen-MoE's shared expert), whose blocks are this rank's rows."""
    return 0 if x.dim() == 2 else 1


def split_sequence(x: torch.Tensor, group) -> torch.Tensor:
    """This rank's block of the sequence (dim 1, or the rows of a 2-d `x`), contiguous."""
    d = _dim(x)
    block = check_sequence(x.shape[d], group)
    return x.narrow(d, dist.get_rank(group) * block, block).contiguous()


def gather_sequence(x: torch.Tensor, group, tag: str) -> torch.Tensor:
    """Every rank's block joined along the sequence: one all-gather."""
    n = dist.get_world_size(group)
    x = x.contiguous()
    out = torch.empty((n, *x.shape), dtype=x.dtype, device=x.device)
    comm.all_gather(out.view(-1), x.view(-1), group=group, tag=tag)
    return torch.cat(out.unbind(0), dim=_dim(x))


def reduce_scatter_sequence(x: torch.Tensor, group, tag: str) -> torch.Tensor:
    """The sum over the ranks of `x`, of which this rank keeps its block: one reduce-scatter."""
    d = _dim(x)
    block = check_sequence(x.shape[d], group)
    flat = torch.cat([part.contiguous().view(-1) for part in x.split(block, dim=d)])
    shape = list(x.shape)
    shape[d] = block
    out = torch.empty(shape, dtype=x.dtype, device=x.device)
    comm.reduce_scatter(out.view(-1), flat, group=group, tag=tag)
    return out


class _GatherFromSequence(torch.autograd.Function):  # g: all-gather forward
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return gather_sequence(x, group, "sp-gather-forward")

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_sequence(grad, ctx.group, "sp-gather-backward"), None


class _ReduceScatterToSequence(torch.autograd.Function):  # ḡ: reduce-scatter forward
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return reduce_scatter_sequence(x, group, "sp-reduce-scatter-forward")

    @staticmethod
    def backward(ctx, grad):
        return gather_sequence(grad, ctx.group, "sp-reduce-scatter-backward"), None


class _LinearWithSequenceGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, group):
        ctx.group, ctx.has_bias = group, bias is not None
        ctx.save_for_backward(x, weight)  # this rank's block only: 1/t of the input
        total = gather_sequence(x, group, "sp-gather-forward")
        return torch.nn.functional.linear(total, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        # one backward computes every gradient; a zero-bubble split (lesson 09) asks for the
        # input's in B and the weights' in W: each part runs its collective once
        x, weight = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if _asked(ctx, 0):
            grad_input = reduce_scatter_sequence(grad @ weight, ctx.group, "sp-gather-backward")
        if ctx.needs_input_grad[1] and not hasattr(ctx, "total"):  # kept from B for W
            ctx.total = gather_sequence(x, ctx.group, "sp-regather-backward")  # section 4.2.2
        if _asked(ctx, 1):
            total = ctx.total.reshape(-1, x.shape[-1])
            grad_weight = grad.reshape(-1, grad.shape[-1]).t() @ total
            del ctx.total
        if ctx.has_bias and _asked(ctx, 2):
            grad_bias = grad.sum(dim=tuple(range(grad.dim() - 1)))
        return grad_input, grad_weight, grad_bias, None


def _asked(ctx, i: int) -> bool:
    """Whether this backward wants the gradient of the Function's input `i`."""
    node = ctx.next_functions[i][0]
    return node is not None and torch._C._will_engine_execute_node(node)


class _ScatterToSequence(torch.autograd.Function):  # into the region from a replicated x
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return split_sequence(x, group)

    @staticmethod
    def backward(ctx, grad):
        return gather_sequence(grad, ctx.group, "sp-scatter-backward"), None


class _GatherWholeSequence(torch.autograd.Function):  # out of sp, for a replicated module
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return gather_sequence(x, group, "sp-whole-forward")

    @staticmethod
    def backward(ctx, grad):
        return split_sequence(grad, ctx.group), None


def gather_whole_sequence(x: torch.Tensor, group) -> torch.Tensor:
    """Out of the sequence-parallel region into a module every rank runs whole and alike:
    all-gather forward; backward keeps this rank's block (every rank holds the same whole
    gradient: nothing to sum; Megatron's `gather_from_sequence_parallel_region` with
    `tensor_parallel_output_grad=False`)."""
    return _GatherWholeSequence.apply(x, group)


def scatter_to_sequence(x: torch.Tensor, group) -> torch.Tensor:
    """Into the sequence-parallel region from an `x` every rank holds whole: keep this
    rank's block, no communication; backward all-gathers the blocks' gradients."""
    return _ScatterToSequence.apply(x, group)


def gather_from_sequence(x: torch.Tensor, group) -> torch.Tensor:
    """Out of the sequence-parallel region: all-gather forward, reduce-scatter backward."""
    return _GatherFromSequence.apply(x, group)


def reduce_scatter_to_sequence(x: torch.Tensor, group) -> torch.Tensor:
    """Into the sequence-parallel region: reduce-scatter forward, all-gather backward."""
    return _ReduceScatterToSequence.apply(x, group)


def linear_with_sequence_gather(x, weight, bias, group) -> torch.Tensor:
    """F.linear(gather_from_sequence(x), weight, bias), saving only this rank's block of x."""
    return _LinearWithSequenceGather.apply(x, weight, bias, group)


def sequence_block(seq: int, group) -> tuple[int, int]:
    """[start, stop) of this rank's block of a sequence of `seq` positions."""
    block = check_sequence(seq, group)
    r = dist.get_rank(group)
    return r * block, (r + 1) * block


def allreduce_replicated_grad(grad: torch.Tensor, group) -> torch.Tensor:
    """A replicated parameter's gradient summed over the tp ranks: under sequence
    parallelism each rank's gradient covers only its block of the sequence (Korthikanti et
    al. 2022, section 4.2.2; Megatron-LM all-reduces the layer norms' gradients)."""
    grad = grad.contiguous().clone()
    comm.all_reduce(grad, group=group, tag="sp-replicated-grad")
    return grad
