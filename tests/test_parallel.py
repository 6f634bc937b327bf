"""The comparison contract holds for a sharded wrapper, not only for replicated ones.

`SliceSharded` is a toy ZeRO: each rank owns one contiguous 1/N slice of every parameter
(padded), steps the optimizer on its slices only, all-gathers the slices into the module
before forward and reduce-scatters the gradients into the slices after backward. Its
`full_parameters` / `full_grads` gather the slices back under the module's names, so
`minidist.training.train` compares it with one process exactly as it does DDP.
"""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import minidist
from minidist import comm
from minidist.data import shard_batch
from minidist.data_parallel.fixture import build, reference
from minidist.parallel import ParallelModule
from minidist.training import max_abs_diff, train

# float32; reduce-scatter sums in another order than one process: as for DP
GRAD_TOL, PARAM_TOL = 1e-6, 1e-5


class SliceSharded(ParallelModule):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.names = [n for n, _ in module.named_parameters()]
        self.shards = nn.ParameterList()
        for p in module.parameters():
            chunk = -(-p.numel() // self.world)
            flat = torch.zeros(chunk * self.world)
            flat[: p.numel()] = p.detach().reshape(-1)
            mine = flat[self.rank * chunk : (self.rank + 1) * chunk].clone()
            self.shards.append(nn.Parameter(mine, requires_grad=p.requires_grad))

    def _gather(self, tensors) -> list[torch.Tensor]:
        out = []
        for t, p in zip(tensors, self.module.parameters()):
            full = torch.empty(t.numel() * self.world)
            comm.all_gather(full, t.detach())
            out.append(full[: p.numel()].view_as(p))
        return out

    def forward(self, x):
        with torch.no_grad():
            for p, full in zip(self.module.parameters(), self._gather(self.shards)):
                p.copy_(full)
        return self.module(x)

    @torch.no_grad()
    def finish_gradient_sync(self) -> None:
        for p, shard in zip(self.module.parameters(), self.shards):
            if p.grad is None:
                continue
            flat = torch.zeros(shard.numel() * self.world)
            flat[: p.numel()] = p.grad.reshape(-1)
            shard.grad = torch.empty_like(shard)
            comm.reduce_scatter(shard.grad, flat)
            shard.grad.div_(self.world)
            p.grad = None  # the full gradient is not kept, only this rank's slice

    def full_parameters(self):
        return dict(zip(self.names, self._gather(self.shards)))

    def full_grads(self):
        have = [(n, s) for n, s in zip(self.names, self.shards) if s.grad is not None]
        gathered = self._gather([s.grad if s.grad is not None else s for s in self.shards])
        return {n: g for n, g in zip(self.names, gathered) if n in dict(have)}


def sharded_rank(model_name: str):
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build(model_name)
    sharded = SliceSharded(model)
    opt = torch.optim.SGD(sharded.shards.parameters(), lr=0.05, momentum=0.9)
    trace = train(sharded, [shard_batch(b, rank, world) for b in batches], loss_fn, opt)
    with torch.no_grad():  # the module's copy is scratch: the contract must not read it
        for p in model.parameters():
            p.fill_(float("nan"))
    return trace, sharded.full_parameters(), [s.numel() for s in sharded.shards]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("model_name", ["mlp", "gpt"])
def test_sharded_wrapper_meets_the_comparison_contract(model_name, world):
    ref = reference(model_name)
    results = minidist.launch(sharded_rank, world, model_name)
    for trace, after_scratch, shard_sizes in results:
        assert max_abs_diff(trace.grads, ref.grads) < GRAD_TOL
        assert max_abs_diff(trace.params, ref.params) < PARAM_TOL
        assert max_abs_diff(after_scratch, ref.params) < PARAM_TOL
        # each rank really holds 1/N of each parameter (rounded up)
        full = [p.numel() for p in build(model_name).model.parameters()]
        assert shard_sizes == [-(-n // world) for n in full]
