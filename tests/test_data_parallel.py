"""Naive and bucketed DP equal one process training on the concatenated batch."""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import minidist
from minidist import comm
from minidist.data import shard_batch
from minidist.data_parallel import BucketedDataParallel, plan_buckets
from minidist.data_parallel.fixture import (
    STEPS,
    TwoHeads,
    accumulate_on_rank,
    accumulated_reference,
    build,
    reference,
    train_on_rank,
    trainable_params,
    unused_on_rank,
    wrap,
)
from minidist.data_parallel.theory import bytes_sent_per_step
from minidist.data_parallel.timeline import overlap_fraction, step_timeline, union_length
from minidist.parallel import named_grads, named_parameters
from minidist.training import make_optimizer, max_abs_diff, train

# float32; the only difference from the reference is the order of summation (N partial
# gradient sums instead of one), a few ulps per step, amplified by 5 momentum steps.
LOSS_TOL, GRAD_TOL, PARAM_TOL = 1e-5, 1e-6, 1e-5
SMALL_BUCKETS = dict(bucket_cap_mb=0.01, first_bucket_cap_mb=0.0025)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind", ["naive", "bucketed"])
@pytest.mark.parametrize("model_name", ["mlp", "gpt"])
def test_dp_equals_single_process(kind, model_name, world):
    ref = reference(model_name)
    # every rank but 0 starts elsewhere: the wrapper's broadcast must undo it
    results = minidist.launch(train_on_rank, world, kind, model_name, True, **SMALL_BUCKETS)
    traces = [t for t, _, _ in results]
    mean_losses = torch.tensor([t.losses for t in traces]).mean(0)
    assert torch.allclose(mean_losses, torch.tensor(ref.losses), atol=LOSS_TOL, rtol=0)
    for t in traces:
        assert max_abs_diff(t.grads, ref.grads) < GRAD_TOL
        assert max_abs_diff(t.params, ref.params) < PARAM_TOL
        # replicas stay bit-identical
        assert max_abs_diff(t.params, traces[0].params) == 0.0
    frozen = [n for n, p in build(model_name).model.named_parameters() if not p.requires_grad]
    assert frozen and all(n not in traces[0].grads for n in frozen)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind", ["naive", "bucketed"])
def test_ledger_matches_theory(kind, world):
    """Per step: all-reduce of every trainable gradient once; ring bytes 2(N-1)/N·Ψ·4."""
    model = build("gpt").model
    psi = trainable_params(model)  # tied counted once, frozen not
    n_trainable = sum(1 for p in model.parameters() if p.requires_grad)
    results = minidist.launch(train_on_rank, world, kind, "gpt", **SMALL_BUCKETS)
    _, ledger, calls_per_step = results[0]
    assert set(ledger.ops()) == {"all_reduce"}
    assert ledger.total_payload_bytes() == STEPS * 4 * psi
    assert ledger.total_ring_bytes() == pytest.approx(STEPS * bytes_sent_per_step(psi, world))
    if kind == "naive":
        assert calls_per_step == n_trainable
    else:
        assert 1 < calls_per_step < n_trainable  # one per bucket


def test_plan_buckets_reverse_order_and_caps():
    params = [torch.zeros(n) for n in (10, 20, 30, 40, 50)]  # 4 bytes each element
    plan = plan_buckets(params, cap_bytes=200, first_cap_bytes=100)
    # 200 B (first bucket closes at >= 100 B), 160+120 B (>= 200 B), then the rest
    assert plan == [[4], [3, 2], [1, 0]]
    mixed = [torch.zeros(4), torch.zeros(4, dtype=torch.float64), torch.zeros(4)]
    assert plan_buckets(mixed, 10**6, 10**6) == [[2], [1], [0]]


def test_unused_parameters():
    # used on rank 0 only: rank 1 contributes zeros, both end with the average
    g = minidist.launch(unused_on_rank, 2, (0,), True)
    torch.manual_seed(0)
    model = TwoHeads()
    x0 = torch.randn(2, 4)
    model.b(x0).sum().backward()
    assert torch.allclose(g[0]["b.weight"], model.b.weight.grad / 2, atol=1e-6)
    assert torch.equal(g[0]["b.weight"], g[1]["b.weight"])
    # unused everywhere: grad stays None, as in one process
    g = minidist.launch(unused_on_rank, 2, (), True)
    assert g[0]["b.weight"] is None and g[1]["a.weight"] is not None
    # without the flag: a clear error instead of a hang
    with pytest.raises(minidist.RankFailedError, match="find_unused_parameters=True"):
        minidist.launch(unused_on_rank, 2, (), False, timeout_s=30)


def test_no_sync_accumulates_then_reduces_once():
    ref = accumulated_reference(3)
    grads, ops = minidist.launch(accumulate_on_rank, 2, 3)[0]
    assert max_abs_diff(grads, ref) < GRAD_TOL
    assert ops == ["all_reduce"]  # one bucket, reduced once, after the last micro-batch


def test_bad_bucket_cap_is_named():
    def rank_fn():
        BucketedDataParallel(nn.Linear(2, 2), bucket_cap_mb=0)

    with pytest.raises(minidist.RankFailedError, match="bucket_cap_mb=0"):
        minidist.launch(rank_fn, 2)


def ours_vs_torch_ddp():
    from torch.nn.parallel import DistributedDataParallel

    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build("gpt")
    local = [shard_batch(b, rank, world) for b in batches]
    ours = train(
        BucketedDataParallel(model, bucket_cap_mb=0.01),
        local,
        loss_fn,
        make_optimizer(model.parameters()),
    )
    model, _, _ = build("gpt")
    native = train(
        model,
        local,
        loss_fn,
        make_optimizer(model.parameters()),
        forward=DistributedDataParallel(model, bucket_cap_mb=0.01),
    )
    return ours, native


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


class Branches(nn.Module):
    """Two independent branches; `order` says which run in forward, and in which order.

    Backward runs autograd nodes in reverse creation order, so the branch computed last in
    forward gets its gradients first: the order of forward sets the order of readiness.
    """

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, order: tuple[str, ...]) -> torch.Tensor:
        ys = [getattr(self, name)(x) for name in order]
        return sum(ys[1:], ys[0])  # a + b == b + a exactly: only readiness depends on order


BRANCH_MB = 80 / 2**20  # one branch (4x4 weight + 4 bias, float32) per bucket
BRANCH_STEPS, BRANCH_BATCH = 2, 8


def branch_batches():
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(BRANCH_BATCH, 4, generator=g), torch.randn(BRANCH_BATCH, 4, generator=g))
        for _ in range(BRANCH_STEPS)
    ]


def branches_on_rank(orders: tuple[tuple[str, ...], ...], find_unused: bool):
    """Train `Branches` (rank r runs `orders[r]`); the gradients' readiness order per step."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = Branches()
    ddp = BucketedDataParallel(
        model,
        bucket_cap_mb=BRANCH_MB,
        first_bucket_cap_mb=BRANCH_MB,
        find_unused_parameters=find_unused,
    )
    names = {id(p): n for n, p in model.named_parameters()}
    ready: list[list[str]] = []
    for p in model.parameters():  # after the wrapper's hooks: fire once it has seen the grad
        p.register_post_accumulate_grad_hook(lambda p: ready[-1].append(names[id(p)]))
    opt = make_optimizer(model.parameters())
    with comm.record() as ledger:
        for batch in branch_batches():
            x, y = shard_batch(batch, rank, world)
            ready.append([])
            opt.zero_grad()
            F.mse_loss(ddp(x, orders[rank]), y).backward()
            grads = named_grads(model)
            opt.step()
    plan = [[names[id(p)] for p in bucket.params] for bucket in ddp.buckets]
    tags = [r.tag for r in ledger.records if r.tag.startswith("bucket")]
    return plan, ready, tags, grads, named_parameters(model)


def branches_reference(orders: tuple[tuple[str, ...], ...]):
    """One process: the mean over ranks of each rank's loss on its slice, as DP computes."""
    torch.manual_seed(0)
    model = Branches()
    opt = make_optimizer(model.parameters())
    for batch in branch_batches():
        opt.zero_grad()
        losses = [
            F.mse_loss(model(x, order), y)
            for x, y, order in (
                (*shard_batch(batch, r, len(orders)), orders[r]) for r in range(len(orders))
            )
        ]
        (sum(losses) / len(orders)).backward()
        grads = named_grads(model)
        opt.step()
    return grads, named_parameters(model)


@pytest.mark.parametrize(
    "orders, find_unused",
    [
        # rank 0: b's bucket (0) is ready first; rank 1: a's bucket (1) is ready first
        ((("a", "b"), ("b", "a")), False),
        # rank 1 leaves a unused: its bucket 1 is complete (zeros) at the first hook
        ((("a", "b"), ("b",)), True),
    ],
    ids=["swapped", "unused-on-one-rank"],
)
def test_buckets_launch_in_index_order_whatever_the_readiness_order(orders, find_unused):
    results = minidist.launch(branches_on_rank, 2, orders, find_unused, timeout_s=30)
    ref_grads, ref_params = branches_reference(orders)
    for rank, (plan, ready, tags, grads, params) in enumerate(results):
        assert plan == [["b.bias", "b.weight"], ["a.bias", "a.weight"]]
        # the precondition: readiness really differs between ranks, on every step
        for step in ready:
            if rank == 0:
                assert [n[0] for n in step] == list("bbaa")
            elif find_unused:
                assert [n[0] for n in step] == list("bb")  # a's bucket was ready before
            else:
                assert [n[0] for n in step] == list("aabb")
        assert tags == ["bucket0", "bucket1"] * BRANCH_STEPS, f"rank {rank}"
        # float32, two ranks summed instead of one process: ~1 ulp on the gradients
        assert max_abs_diff(grads, ref_grads) < GRAD_TOL, f"rank {rank}"
        assert max_abs_diff(params, ref_params) < PARAM_TOL, f"rank {rank}"


def test_union_length_and_overlap_fraction():
    assert union_length([]) == 0.0
    assert union_length([(0.0, 2.0), (1.0, 3.0)]) == 3.0  # overlapping
    assert union_length([(2.0, 3.0), (0.0, 1.0)]) == 2.0  # disjoint, unsorted
    assert union_length([(0.0, 5.0), (1.0, 2.0)]) == 5.0  # nested
    assert union_length([(0.0, 1.0), (1.0, 2.0)]) == 2.0  # touching
    assert union_length([(0.0, 2.0), (3.0, 5.0)], until=4.0) == 3.0  # cut by until
    assert union_length([(3.0, 5.0)], until=2.0) == 0.0  # entirely after until
    assert overlap_fraction([], compute_end=1.0) == 0.0
    assert overlap_fraction([(0.0, 2.0), (3.0, 5.0)], compute_end=1.0) == 0.25
    assert overlap_fraction([(0.0, 2.0), (1.0, 3.0)], compute_end=10.0) == 1.0  # all hidden
    assert overlap_fraction([(2.0, 3.0)], compute_end=1.0) == 0.0  # all after compute


def timelines_on_rank():
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for kind in ("naive", "bucketed"):
        model, batches, loss_fn = build("mlp")
        wrapped = wrap(kind, model, **SMALL_BUCKETS)
        batch = shard_batch(batches[0], rank, world)
        out[kind] = step_timeline(wrapped, batch, loss_fn, make_optimizer(model.parameters()))
    return out


def test_naive_overlaps_nothing_bucketed_something():
    for timelines in minidist.launch(timelines_on_rank, 2, timeout_s=30):
        naive, bucketed = timelines["naive"], timelines["bucketed"]
        assert naive.comm and all(start >= naive.backward_end for start, *_ in naive.comm)
        assert naive.overlap < 0.05  # naive all-reduces all start after backward
        # every bucket is launched from a gradient hook, so before backward's last hook
        assert len(bucketed.comm) > 1
        assert all(start < bucketed.backward_end for start, *_ in bucketed.comm)
        assert 0 < bucketed.overlap <= 1


class Dot(nn.Module):
    """Σ_i <p_i, g_i>: backward leaves exactly g_i (in the compute dtype) in p_i.grad."""

    def __init__(self, shapes):
        super().__init__()
        torch.manual_seed(0)
        self.ps = nn.ParameterList(nn.Parameter(torch.randn(s)) for s in shapes)

    def forward(self, grads):
        return sum((p * g.to(p.dtype)).sum() for p, g in zip(self.ps, grads)).float()


SHAPES = [(3, 5), (7,), (1,)]


def rank_gradients(rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return [torch.randn(s, generator=g) for s in SHAPES]


def mean_gradient_rank():
    """The gradients BucketedDataParallel leaves when every rank's own differs: fp32, and
    mixed precision (bf16 compute and reduction, divided in two parts, pre and post)."""
    from minidist.mixed_precision import MixedPrecision

    out = {}
    for label, policy in (("fp32", None), ("bf16", MixedPrecision(torch.bfloat16, torch.bfloat16))):
        ddp = BucketedDataParallel(Dot(SHAPES), mixed_precision=policy, bucket_cap_mb=1e-5)
        ddp(rank_gradients(dist.get_rank())).backward()
        ddp.finish_gradient_sync()
        out[label] = list(ddp.full_grads().values())
    return out


@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_reduced_gradient_is_the_mean_with_and_without_mixed_precision(world):
    """Divided by N exactly once: all of it before the sum in fp32, pre before and post after
    with mixed precision (`divide_factors`: 1 and 2 at N = 2, 2 and 2 at N = 4)."""
    mean = [sum(gs[i] for gs in map(rank_gradients, range(world))) / world for i in range(3)]
    for got in minidist.launch(mean_gradient_rank, world):
        for i in range(3):
            assert (got["fp32"][i] - mean[i]).abs().max() < 1e-6
            # bf16: 8 bits of mantissa on values of order 1 (a wrong factor is off by 2x)
            assert (got["bf16"][i] - mean[i]).abs().max() < 3e-2


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_memory_per_replica_is_the_formula_with_adams_step_counters(name, optimizer):
    """Measured after one step of a replica (every rank holds everything): parameters (frozen
    ones too), gradients, the optimizer's buffers and, for Adam, one step counter per tensor."""
    from minidist.data_parallel import theory
    from minidist.memory import model_state_bytes
    from minidist.training import make_optimizer

    model, batches, loss_fn = build(name)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(trainable, optimizer)
    x, y = batches[0]
    loss_fn(model(x), y).backward()
    opt.step()
    n_params = sum(p.numel() for p in model.parameters())
    expected = theory.model_state_bytes_per_rank(
        n_params, trainable_params(model), optimizer, n_state_tensors=len(trainable)
    )
    assert model_state_bytes(model, opt).total == expected
