"""Naive and bucketed DP equal one process training on the concatenated batch."""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from helpers import STEPS, build
from hypothesis import given, settings
from hypothesis import strategies as st

import minidist
from minidist import comm
from minidist.data import shard_batch
from minidist.data_parallel import BucketedDataParallel, NaiveDataParallel, plan_buckets
from minidist.training import make_optimizer, max_abs_diff, train

# float32; the only difference from the reference is the order of summation (N partial
# gradient sums instead of one), a few ulps per step, amplified by 5 momentum steps.
LOSS_TOL, GRAD_TOL, PARAM_TOL = 1e-5, 1e-6, 1e-5


def dp_rank(kind: str, model_name: str, bucket_cap_mb: float = 25.0):
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build(model_name)
    if rank != 0:  # different starting points: the wrapper must broadcast rank 0's
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    if kind == "naive":
        wrapped = NaiveDataParallel(model)
        before_step = wrapped.all_reduce_gradients
    else:
        wrapped = BucketedDataParallel(
            model, bucket_cap_mb=bucket_cap_mb, first_bucket_cap_mb=bucket_cap_mb / 4
        )
        before_step = None
    local = [shard_batch(b, rank, world) for b in batches]
    with comm.record() as ledger:
        trace = train(
            model, local, loss_fn, make_optimizer(model.parameters()), wrapped, before_step
        )
    n_buckets = len(wrapped.buckets) if kind == "bucketed" else None
    return trace, ledger.records, n_buckets


def reference(model_name: str):
    model, batches, loss_fn = build(model_name)
    return train(model, batches, loss_fn, make_optimizer(model.parameters())), model


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind", ["naive", "bucketed"])
@pytest.mark.parametrize("model_name", ["mlp", "gpt"])
def test_dp_equals_single_process(kind, model_name, world):
    ref, ref_model = reference(model_name)
    results = minidist.launch(dp_rank, world, kind, model_name, 0.01)
    traces = [t for t, _, _ in results]
    mean_losses = torch.tensor([t.losses for t in traces]).mean(0)
    assert torch.allclose(mean_losses, torch.tensor(ref.losses), atol=LOSS_TOL, rtol=0)
    for t in traces:
        assert max_abs_diff(t.grads, ref.grads) < GRAD_TOL
        assert max_abs_diff(t.params, ref.params) < PARAM_TOL
        # replicas stay bit-identical
        assert max_abs_diff(t.params, traces[0].params) == 0.0
    frozen = [n for n, p in ref_model.named_parameters() if not p.requires_grad]
    assert frozen and all(n not in traces[0].grads for n in frozen)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind", ["naive", "bucketed"])
def test_ledger_matches_theory(kind, world):
    """Per step: all-reduce of every trainable gradient once; ring bytes 2(N-1)/N·Ψ·4."""
    _, ref_model = reference("gpt")
    trainable = [p for p in ref_model.parameters() if p.requires_grad]  # tied counted once
    grad_bytes = sum(p.numel() * 4 for p in trainable)
    records = minidist.launch(dp_rank, world, kind, "gpt", 0.01)[0][1]
    assert {r.op for r in records} == {"all_reduce"}
    assert sum(r.payload_bytes for r in records) == STEPS * grad_bytes
    ring = sum(r.ring_bytes for r in records)
    assert ring == pytest.approx(STEPS * 2 * (world - 1) / world * grad_bytes)
    calls_per_step = len(records) // STEPS
    if kind == "naive":
        assert calls_per_step == len(trainable)
    else:
        n_buckets = minidist.launch(dp_rank, world, kind, "gpt", 0.01)[0][2]
        assert calls_per_step == n_buckets < len(trainable)


def test_plan_buckets_reverse_order_and_caps():
    params = [torch.zeros(n) for n in (10, 20, 30, 40, 50)]  # 4 bytes each element
    plan = plan_buckets(params, cap_bytes=200, first_cap_bytes=100)
    # 200 B (first bucket closes at >= 100 B), 160+120 B (>= 200 B), then the rest
    assert plan == [[4], [3, 2], [1, 0]]
    mixed = [torch.zeros(4), torch.zeros(4, dtype=torch.float64), torch.zeros(4)]
    assert plan_buckets(mixed, 10**6, 10**6) == [[2], [1], [0]]


class TwoHeads(nn.Module):
    """`b` is used only when asked to: an unused parameter on some steps or ranks."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x, use_b):
        y = self.a(x)
        return y + self.b(x) if use_b else y


def unused_rank(use_b_on_ranks, find_unused):
    torch.manual_seed(0)
    model = TwoHeads()
    ddp = BucketedDataParallel(model, find_unused_parameters=find_unused, first_bucket_cap_mb=1e-4)
    x = torch.randn(2, 4) + dist.get_rank()
    ddp(x, dist.get_rank() in use_b_on_ranks).sum().backward()
    return {n: (None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()}


def test_unused_parameters():
    # used on rank 0 only: rank 1 contributes zeros, both end with the average
    g = minidist.launch(unused_rank, 2, (0,), True)
    torch.manual_seed(0)
    model = TwoHeads()
    x0 = torch.randn(2, 4)
    model.b(x0).sum().backward()
    assert torch.allclose(g[0]["b.weight"], model.b.weight.grad / 2, atol=1e-6)
    assert torch.equal(g[0]["b.weight"], g[1]["b.weight"])
    # unused everywhere: grad stays None, as in one process
    g = minidist.launch(unused_rank, 2, (), True)
    assert g[0]["b.weight"] is None and g[1]["a.weight"] is not None
    # without the flag: a clear error instead of a hang
    with pytest.raises(minidist.RankFailedError, match="find_unused_parameters=True"):
        minidist.launch(unused_rank, 2, (), False, timeout_s=30)


def no_sync_rank(accumulate: int):
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build("mlp", steps=accumulate)
    ddp = BucketedDataParallel(model)
    with comm.record() as ledger:
        for i, batch in enumerate(batches):
            x, y = shard_batch(batch, rank, world)
            if i < accumulate - 1:
                with ddp.no_sync():
                    loss_fn(ddp(x), y).backward()
            else:
                loss_fn(ddp(x), y).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return grads, len(ledger.records)


def test_no_sync_accumulates_then_reduces_once():
    model, batches, loss_fn = build("mlp", steps=3)
    for x, y in batches:
        loss_fn(model(x), y).backward()
    ref = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    grads, n_collectives = minidist.launch(no_sync_rank, 2, 3)[0]
    assert max_abs_diff(grads, ref) < GRAD_TOL
    assert n_collectives == 1  # one bucket, reduced once, after the last micro-batch


def test_bad_bucket_cap_is_named():
    def rank_fn():
        BucketedDataParallel(nn.Linear(2, 2), bucket_cap_mb=0)

    with pytest.raises(minidist.RankFailedError, match="bucket_cap_mb=0"):
        minidist.launch(rank_fn, 2)


def ours_vs_torch_ddp():
    from torch.nn.parallel import DistributedDataParallel

    rank, world = dist.get_rank(), dist.get_world_size()
    traces = []
    for wrap in (
        lambda m: BucketedDataParallel(m, bucket_cap_mb=0.01),
        lambda m: DistributedDataParallel(m, bucket_cap_mb=0.01),
    ):
        model, batches, loss_fn = build("gpt")
        local = [shard_batch(b, rank, world) for b in batches]
        traces.append(train(model, local, loss_fn, make_optimizer(model.parameters()), wrap(model)))
    return traces


def test_same_result_as_torch_ddp():
    ours, native = minidist.launch(ours_vs_torch_ddp, 2)[0]
    assert max_abs_diff(ours.params, native.params) < PARAM_TOL
    assert ours.losses == pytest.approx(native.losses, abs=LOSS_TOL)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 300), min_size=1, max_size=30),
    cap=st.integers(4, 2000),
    first_cap=st.integers(4, 2000),
)
def test_plan_buckets_properties(sizes, cap, first_cap):
    params = [torch.zeros(n) for n in sizes]
    plan = plan_buckets(params, cap, first_cap)
    # every parameter exactly once, in reverse registration order
    assert [i for bucket in plan for i in bucket] == list(reversed(range(len(sizes))))
    for b, bucket in enumerate(plan):
        limit = first_cap if b == 0 else cap
        nbytes = [4 * sizes[i] for i in bucket]
        assert sum(nbytes[:-1]) < limit  # a bucket closes as soon as it reaches its cap
        if b < len(plan) - 1:
            assert sum(nbytes) >= limit  # ...and only then
