"""The comparison contract holds for a sharded wrapper, not only for replicated ones.

`SliceSharded` is a toy ZeRO: each rank owns one contiguous 1/N slice of every parameter
(padded), steps the optimizer on its slices only, all-gathers the slices into the module
before forward and reduce-scatters the gradients into the slices after backward. Its
`full_parameters` / `full_grads` gather the slices back under the module's names, so
`minidist.training.train` compares it with one process exactly as it does DDP.
"""

import time

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import minidist
from minidist import comm
from minidist.data import shard_batch
from minidist.data_parallel.fixture import build, reference, wrap
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


class WithBuffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.register_buffer("running", torch.zeros(2))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))
        self.register_buffer("scratch", torch.zeros(3), persistent=False)

    def forward(self, x):
        return self.lin(x)


def state_after_wrapping(kind: str):
    """Every rank but 0 changes its parameters and buffers before wrapping."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = WithBuffers()
    if rank != 0:
        with torch.no_grad():
            for t in list(model.parameters()) + list(model.buffers()):
                t.add_(rank)
    wrap(kind, model)
    return {n: t.clone() for n, t in [*model.named_parameters(), *model.named_buffers()]}


@pytest.mark.parametrize("kind", ["naive", "bucketed"])
def test_wrapping_broadcasts_rank0_parameters_and_buffers(kind):
    states = minidist.launch(state_after_wrapping, 3, kind, timeout_s=30)
    torch.manual_seed(0)
    expected = WithBuffers()
    assert set(states[0]) == {"lin.weight", "lin.bias", "running", "count", "scratch"}
    for rank, state in enumerate(states):
        for name, t in [*expected.named_parameters(), *expected.named_buffers()]:
            assert torch.equal(state[name], t), f"rank {rank}: {name} is not rank 0's"


def mlp(*widths: int) -> nn.Sequential:
    layers = [nn.Linear(i, o) for i, o in zip(widths, widths[1:])]
    return nn.Sequential(*layers)


# rank -> the model that rank builds; every other rank builds mlp(4, 8, 2)
ODD_ONE_OUT = {
    "shape": (1, lambda: mlp(4, 6, 2)),  # first mismatch: 0.weight (8, 4) vs (6, 4)
    "extra-layer": (2, lambda: mlp(4, 8, 2, 2)),  # first mismatch: 2.weight vs nothing
    "no-parameters": (1, lambda: nn.Sequential(nn.ReLU())),  # 0.weight vs nothing
    "frozen": (1, lambda: mlp(4, 8, 2).requires_grad_(False)),  # trainable vs frozen
}


def wrap_model(kind: str, case: str | None, catch: bool):
    """Wrap this rank's model; with `catch`, return the error message instead of raising."""
    odd_rank, odd = ODD_ONE_OUT[case] if case else (None, None)
    model = odd() if dist.get_rank() == odd_rank else mlp(4, 8, 2)
    try:
        with comm.record() as ledger:
            wrap(kind, model)
    except ValueError as e:
        if not catch:
            raise
        return str(e)
    return [r.tag for r in ledger.records]


EXPECTED_MESSAGE = {
    "shape": [
        "first at entry 0",
        "ranks [0, 2]: parameter 0.weight (8, 4) torch.float32",
        "ranks [1]: parameter 0.weight (6, 4) torch.float32",
    ],
    "extra-layer": [
        "first at entry 4",
        "ranks [0, 1]: (nothing: fewer entries)",
        "ranks [2]: parameter 2.weight (2, 2) torch.float32",
    ],
    "no-parameters": [
        "first at entry 0",
        "ranks [0, 2]: parameter 0.weight (8, 4) torch.float32",
        "ranks [1]: (nothing: fewer entries)",
    ],
    "frozen": [
        "first at entry 0",
        "ranks [0, 2]: parameter 0.weight (8, 4) torch.float32;",
        "ranks [1]: parameter 0.weight (8, 4) torch.float32 frozen",
    ],
}


@pytest.mark.parametrize("case", list(ODD_ONE_OUT))
@pytest.mark.parametrize("kind", ["naive", "bucketed"])
def test_different_models_raise_on_every_rank_naming_the_mismatch(kind, case):
    who = {"naive": "NaiveDataParallel", "bucketed": "BucketedDataParallel"}[kind]
    start = time.perf_counter()
    messages = minidist.launch(wrap_model, 3, kind, case, True, timeout_s=30)
    for message in messages:  # every rank raised (none hangs), with the same message
        assert isinstance(message, str) and message == messages[0]
        assert message.startswith(f"{who}: the model differs between ranks")
        for part in EXPECTED_MESSAGE[case]:
            assert part in message
    # uncaught, it fails the world quickly with that message
    with pytest.raises(minidist.RankFailedError, match=r"ValueError: .*ranks \[") as info:
        minidist.launch(wrap_model, 3, kind, case, False, timeout_s=30)
    assert all(part in str(info.value) for part in EXPECTED_MESSAGE[case])
    assert time.perf_counter() - start < 20


@pytest.mark.parametrize("kind", ["naive", "bucketed"])
def test_same_model_passes_the_check(kind):
    for tags in minidist.launch(wrap_model, 3, kind, None, False, timeout_s=30):
        # two small all-gathers, then one broadcast of the 4 parameters (float32, one flat)
        assert tags == ["verify-model"] * 2 + ["init"]


def broadcast_mixed_model():
    from minidist.parallel import broadcast_parameters

    torch.manual_seed(dist.get_rank())  # every rank starts from its own weights
    model = nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 2).to(torch.bfloat16))
    model.register_buffer("count", torch.randint(0, 100, (7,)))
    with comm.record() as ledger:
        broadcast_parameters(model)
    state = {k: v.float() for k, v in model.state_dict().items()}
    return state, sorted((r.tag, str(r.dtype), r.payload_bytes) for r in ledger.records)


def test_the_initial_broadcast_gives_every_rank_rank_zeros_tensors_one_call_per_dtype():
    """Parameters and buffers of three dtypes, different on every rank: after the broadcast
    every rank holds rank 0's, each dtype in one flat broadcast of its tensors' bytes."""
    got = minidist.launch(broadcast_mixed_model, 3)
    torch.manual_seed(0)
    want = nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 2).to(torch.bfloat16))
    want.register_buffer("count", torch.randint(0, 100, (7,)))
    for state, calls in got:
        assert state.keys() == want.state_dict().keys()
        assert all(torch.equal(state[k], v.float()) for k, v in want.state_dict().items())
        assert calls == sorted(
            [
                ("init", "torch.float32", (3 * 5 + 5) * 4),
                ("init", "torch.bfloat16", (5 * 2 + 2) * 2),
                ("init", "torch.int64", 7 * 8),
            ]
        )
