"""The sp bench's model (lesson 14's sequence-parallel MLP blocks) trains the dense model:
its replicated parameters' gradients (layer norms, the second Linear's bias) are summed over
the ranks' blocks of the sequence, equal to one process's (issue 27)."""

import copy

import torch
import torch.distributed as dist

import minidist
from minidist.megatron.layers import gather_split
from minidist.megatron.lesson import MLPStack
from minidist.megatron.sequence import split_sequence
from minidist.sequence_parallel.lesson import _minidist_sp

# float32, the sums over the sequence in another order: 1e-5 relative
TOL = 1e-5


def _sp_grads_against_dense(draws):
    worst = 0.0
    for seed, (b, s_per_rank, h, layers) in enumerate(draws):
        s = s_per_rank * dist.get_world_size()
        torch.manual_seed(seed)
        dense = MLPStack(h, layers)
        ours = _minidist_sp(copy.deepcopy(dense))
        x = torch.randn(b, s, h, generator=torch.Generator().manual_seed(seed + 100))
        dense(x).pow(2).sum().backward()
        ours(split_sequence(x, None)).pow(2).sum().backward()
        for (_, mine), (_, want) in zip(ours.named_parameters(), dense.named_parameters()):
            split = getattr(mine, "tp_split", None)
            g = gather_split(mine.grad, split, None) if split else mine.grad
            scale = want.grad.abs().max().clamp_min(1.0)
            worst = max(worst, float((g - want.grad).abs().max() / scale))
    return worst


def test_the_sp_bench_model_has_the_dense_gradients_over_sizes():
    g = torch.Generator().manual_seed(0)
    draws = [
        tuple(
            int(v)
            for v in (
                torch.randint(1, 3, (1,), generator=g),
                torch.randint(1, 4, (1,), generator=g),
                4 * torch.randint(1, 4, (1,), generator=g),
                torch.randint(1, 3, (1,), generator=g),
            )
        )
        for _ in range(6)
    ]
    assert max(minidist.launch(_sp_grads_against_dense, 2, draws)) < TOL
