"""Mixed precision on FSDP tracks fp32; the loss scaler follows GradScaler on every rank."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import minidist
from minidist.data_parallel.fixture import build
from minidist.mixed_precision import DynamicLossScaler, MixedPrecision, divide_factors, theory
from minidist.mixed_precision.fixture import grad_scaler_scales, train_on_rank
from minidist.mixed_precision.lesson import LOSS_TOL, PATH_TOL, distance
from minidist.zero.fixture import reference


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_training_tracks_fp32(dtype):
    ref = reference("gpt")
    results = minidist.launch(train_on_rank, 2, dtype)
    fp32 = minidist.launch(train_on_rank, 2, torch.float32)[0]
    losses = torch.tensor([r["losses"] for r in results]).mean(0)
    assert (losses - torch.tensor(ref.losses)).abs().max() < LOSS_TOL[dtype]
    start = {n: p.detach() for n, p in build("gpt").model.named_parameters()}
    travelled = distance(start, ref.params)
    for r in results:
        assert distance(r["params"][-1], ref.params) < PATH_TOL[dtype] * travelled
    # the all-gather runs in the compute dtype: half the bytes of fp32
    assert results[0]["all_gather_bytes"] * 2 == fp32["all_gather_bytes"]


def test_scale_sequence_equals_grad_scaler_and_skips_on_every_rank():
    """Overflow injected on the last rank only at steps 1 and 2; growth every 2 good steps."""
    overflows = (1, 2)
    results = minidist.launch(train_on_rank, 2, torch.float16, overflows, growth_interval=2)
    expected = grad_scaler_scales(len(results[0]["scales"]), overflows, growth_interval=2)
    for r in results:
        assert r["scales"] == expected
        assert r["stepped"] == [s not in overflows for s in range(len(expected))]
        # only the last rank's own shard held the inf; every rank skipped
        assert r["local_inf"] == [s in overflows and r is results[-1] for s in range(len(expected))]
        for s in overflows:  # a skipped step touches no parameter and no optimizer state
            before, after = r["params"][s - 1], r["params"][s]
            assert all(torch.equal(before[k], after[k]) for k in before)
            assert all(
                torch.equal(x[k], y[k])
                for x, y in zip(r["states"][s - 1], r["states"][s])
                for k in x
            )


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="param_dtype=torch.int8 is not supported"):
        MixedPrecision(param_dtype=torch.int8)
    with pytest.raises(ValueError, match="float16 needs a loss scaler"):
        MixedPrecision(torch.float16)
    with pytest.raises(ValueError, match="growth_factor=1.0 must be a finite number > 1"):
        DynamicLossScaler(growth_factor=1.0)
    scaler = DynamicLossScaler()
    with pytest.raises(RuntimeError, match="needs a step"):
        scaler.update()


@pytest.mark.parametrize("world", [1, 2, 4, 8, 16, 6])
def test_divide_factors_split_n(world):
    pre, post = divide_factors(world)
    assert pre * post == world and pre <= post and world % pre == 0


def test_divide_factors_values_and_how_they_differ_from_torch_fsdp():
    from torch.distributed.algorithms._comm_hooks.default_hooks import DefaultState

    torch_rule = DefaultState._get_gradient_predivide_factor
    assert [divide_factors(n) for n in (1, 2, 3, 4, 6, 8, 12, 16, 128)] == [
        (1, 1),
        (1, 2),
        (1, 3),
        (2, 2),
        (2, 3),
        (2, 4),
        (2, 6),
        (4, 4),
        (8, 16),
    ]
    for k in range(8):
        n = 2**k
        pre, post = divide_factors(n)
        # powers of 4 agree; otherwise torch's pre is this post: the same pair, swapped
        assert (torch_rule(n), n / torch_rule(n)) == ((pre, post) if k % 2 == 0 else (post, pre))
    assert torch_rule(3) == 2.0 and 3 % torch_rule(3) != 0  # torch's need not divide N
    for n in range(1, 200):
        pre, post = divide_factors(n)
        assert n % pre == 0 and pre * pre <= n and pre * post == n
        assert n % (2 * pre) != 0 or (2 * pre) ** 2 > n  # the largest such power of 2


@settings(max_examples=200, deadline=None)
@given(world=st.integers(1, 1 << 16))
def test_divide_factors_pre_is_the_largest_power_of_two_up_to_sqrt_n(world):
    """pre: a power of 2 dividing N with pre² <= N, and no larger one is (2·pre does not
    divide N, or (2·pre)² > N); post = N / pre, exactly."""
    pre, post = divide_factors(world)
    assert isinstance(pre, float) and pre.is_integer()
    k = int(pre)
    assert k & (k - 1) == 0 and world % k == 0 and k * k <= world
    assert world % (2 * k) or (2 * k) ** 2 > world
    assert post == world / k and pre * post == world


def memory_rank(world_dtype):
    import torch.distributed as dist

    from minidist.data import shard_batch
    from minidist.fsdp import FullyShardedDataParallel
    from minidist.fsdp.fixture import UNITS, fsdp_state_bytes
    from minidist.zero.fixture import ADAM

    model, batches, loss_fn = build("gpt")
    fsdp = FullyShardedDataParallel(
        model, wrap=UNITS["gpt"], mixed_precision=MixedPrecision(world_dtype)
    )
    opt = torch.optim.Adam(fsdp.sharded_parameters(), **ADAM)
    x, y = shard_batch(batches[0], dist.get_rank(), dist.get_world_size())
    loss_fn(fsdp(x), y).backward()
    opt.step()
    frozen = sum(p.numel() * p.element_size() for p in model.parameters())  # outside units
    return fsdp_state_bytes(fsdp, opt).total - frozen, [u.layout.padded for u in fsdp.units]


@pytest.mark.parametrize("world", [2, 4])
def test_memory_per_rank_is_the_mixed_precision_formula_over_n(world):
    """ZeRO stage 3 with mixed-precision Adam: (2 + 2 + 12)Ψ/N. Between steps FSDP keeps the
    fp32 master chunk (4) and Adam's moments (8) = K = 12, and the gradient chunk; the bf16
    compute copies exist only while a unit runs. The gradient chunk is kept in fp32 (4, not
    2): the total is the formula's 16Ψ/N all the same. Plus Adam's step counters."""
    from minidist.zero import theory

    total, padded = minidist.launch(memory_rank, world, torch.bfloat16)[0]
    assert total == theory.memory_per_device(sum(padded), world, 3) + 4 * len(padded)


def zero_rank(stage: int, dtype):
    import torch.distributed as dist

    from minidist.data import shard_batch
    from minidist.training import train
    from minidist.zero import ZeroDataParallel
    from minidist.zero.fixture import ADAM, zero_state_bytes

    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build("gpt")
    zero = ZeroDataParallel(model, stage=stage, mixed_precision=MixedPrecision(dtype), **ADAM)
    trace = train(zero, [shard_batch(b, rank, world) for b in batches], loss_fn, zero.optimizer)
    frozen = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)
    padded = sum(b.layout.padded for b in zero.buckets)
    return trace, zero_state_bytes(zero).total - frozen, padded, len(zero.buckets)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("stage", [1, 2])
def test_zero_mixed_precision_tracks_fp32_and_memory_is_the_papers(stage, world):
    """ZeRO section 5 with mixed-precision Adam: stage 1 keeps 2Ψ bf16 parameters + 2Ψ bf16
    gradients + 12Ψ/N (fp32 master chunk and two moments); stage 2 2Ψ + (2 + 12)Ψ/N. The
    fp32 gradient the optimizer steps with exists during the step only."""
    from minidist.zero import theory

    ref = reference("gpt")
    start = {n: p.detach() for n, p in build("gpt").model.named_parameters()}
    for trace, total, padded, buckets in minidist.launch(zero_rank, world, stage, torch.bfloat16):
        losses_close = abs(trace.losses[0] - ref.losses[0]) < 0.5  # one rank's slice
        assert losses_close
        assert distance(trace.params, ref.params) < PATH_TOL[torch.bfloat16] * distance(
            start, ref.params
        )
        assert total == theory.memory_per_device(padded, world, stage) + 4 * buckets


# -- theory --------------------------------------------------------------------------------------


def test_float_formats_are_read_from_finfo_and_hold_at_the_boundaries():
    f16, bf16, f32 = (theory.float_format(d) for d in theory.FORMATS[1:] + theory.FORMATS[:1])
    assert (f16.exponent_bits, f16.mantissa_bits, f16.max) == (5, 10, 65504.0)
    assert (f16.smallest_normal, f16.smallest_subnormal) == (2.0**-14, 2.0**-24)
    assert (bf16.exponent_bits, bf16.mantissa_bits, bf16.smallest_subnormal) == (8, 7, 2.0**-133)
    assert (f32.mantissa_bits, f32.smallest_subnormal) == (23, 2.0**-149)
    for dtype in theory.FORMATS:
        f = theory.float_format(dtype)
        assert torch.tensor(f.smallest_subnormal, dtype=torch.float64).to(dtype) > 0
        assert torch.tensor(f.smallest_subnormal / 2, dtype=torch.float64).to(dtype) == 0
        assert torch.tensor(1 + f.eps / 2, dtype=torch.float64).to(dtype) == 1  # ties to even
    with pytest.raises(ValueError, match="not a floating-point dtype"):
        theory.float_format(torch.int32)


def test_fate_sorts_values_by_what_the_cast_does():
    values = torch.tensor([2.0**-26, 2.0**-20, 2.0**-10, 1e5, 0.0])
    assert theory.fate(values, torch.float16) == dict(
        zero=0.25, subnormal=0.25, normal=0.25, overflow=0.25
    )
    scaled = theory.fate(values, torch.float16, scale=2.0**8)  # 2^-18, 2^-12, 2^-2, inf
    assert scaled == dict(zero=0.0, subnormal=0.25, normal=0.5, overflow=0.25)
    assert theory.fate(values, torch.bfloat16)["normal"] == 1.0
    assert theory.largest_safe_scale(0.5, torch.float16) == 2.0**16  # 0.5 · 2^17 = 65536
    assert theory.largest_safe_scale(0.46, torch.float16) == 2.0**17


@pytest.mark.parametrize("world", [1, 2, 4, 64])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_model_state_terms_are_the_papers_formula(stage, world):
    from minidist.zero import theory as zero_theory

    terms = theory.model_state_terms(1000, world, stage)
    assert sum(terms.values()) == pytest.approx(zero_theory.memory_per_device(1000, world, stage))
    assert (
        theory.rank_bytes(1000, world, stage, frozen=3, adam_steps=2)
        == int(zero_theory.memory_per_device(1000, world, stage)) + 2 * 3 + 4 * 2
    )


def test_splitting_the_division_keeps_an_fp16_mean_in_range():
    pre, post = divide_factors(64)
    assert theory.ring_mean([2048.0] * 64, torch.float16, 1, 64)[1] == float("inf")
    assert theory.ring_mean([2.0**-20] * 64, torch.float16, 64, 1)[1] == 0.0
    assert theory.ring_mean([2048.0] * 64, torch.float16, pre, post)[1] == 2048.0
    assert theory.ring_mean([2.0**-20] * 64, torch.float16, pre, post)[1] == 2.0**-20


def test_found_inf_is_one_small_all_reduce_per_step():
    results = minidist.launch(train_on_rank, 2, torch.float16)
    for r in results:
        assert r["found_inf_sent"] == [theory.found_inf_bytes(2)] * len(r["losses"])


def test_tour_rows_on_two_ranks(tmp_path):
    """The tour runs the rows on 4 ranks (tests/test_bench_tour.py); here N = 2."""
    from minidist.mixed_precision.lesson import fsdp_bf16_row, zero2_bf16_row

    for row_fn in (fsdp_bf16_row, zero2_bf16_row):
        row = row_fn(2, tmp_path)
        assert row.matches, row
        assert row.memory_per_rank == row.memory_theory
        assert row.bytes_per_rank == pytest.approx(row.bytes_theory)


def zero_scaler_rank(dtype):
    import torch.distributed as dist

    from minidist.data import shard_batch
    from minidist.zero import ZeroDataParallel
    from minidist.zero.fixture import ADAM

    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build("gpt")
    scaler = DynamicLossScaler(init_scale=2.0**8)
    policy = MixedPrecision(dtype, loss_scaler=scaler)
    zero = ZeroDataParallel(model, stage=2, mixed_precision=policy, **ADAM)
    stepped, changed = [], []
    for step, batch in enumerate(batches):
        before = zero.full_parameters()
        x, y = shard_batch(batch, rank, world)
        zero.optimizer.zero_grad()
        scaler.scale(loss_fn(zero(x), y)).backward()
        if step == 1 and rank == world - 1:  # an overflow on one rank only
            zero.buckets[0].grad_chunk[0] = float("inf")
        stepped.append(scaler.step(zero.optimizer))
        scaler.update()
        after = zero.full_parameters()
        changed.append(any(not torch.equal(before[k], after[k]) for k in before))
    return stepped, changed, scaler.get_scale()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_loss_scaler_sees_zero_gradient_chunks(dtype):
    """ZeRO keeps its reduced gradients as chunks in the compute dtype: the scaler unscales
    and checks those (`ShardedOptimizer.gradients`), so one rank's inf skips every rank."""
    for stepped, changed, scale in minidist.launch(zero_scaler_rank, 2, dtype):
        assert stepped == [True, False, True, True, True]
        assert changed == stepped  # the skipped step touched no parameter
        assert scale == 2.0**7


def ddp_rank(dtype, reduce_dtype):
    import torch.distributed as dist

    from minidist import comm
    from minidist.data import shard_batch
    from minidist.data_parallel import BucketedDataParallel
    from minidist.training import train
    from minidist.zero.fixture import ADAM

    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build("gpt")
    ddp = BucketedDataParallel(model, mixed_precision=MixedPrecision(dtype, reduce_dtype))
    opt = torch.optim.Adam(ddp.master_parameters(), **ADAM)
    with comm.record() as ledger:
        trace = train(ddp, [shard_batch(b, rank, world) for b in batches], loss_fn, opt)
    payload = sum(r.payload_bytes for r in ledger.records if r.op == "all_reduce")
    dtypes = {p.dtype for p in model.parameters()} | {m.dtype for m in ddp.masters}
    return trace, payload, dtypes


@pytest.mark.parametrize("reduce_dtype", [torch.float32, torch.bfloat16])
def test_ddp_mixed_precision_tracks_fp32(reduce_dtype):
    """DDP with bf16 compute copies refreshed from fp32 masters each forward; the bucket
    all-reduce runs in the reduction dtype (bf16: half the bytes)."""
    from minidist.data_parallel.fixture import STEPS
    from minidist.data_parallel.theory import bytes_sent_per_step  # noqa: F401 (same Ψ)

    ref = reference("gpt")
    start = {n: p.detach() for n, p in build("gpt").model.named_parameters()}
    psi = sum(p.numel() for p in build("gpt").model.parameters() if p.requires_grad)
    for trace, payload, dtypes in minidist.launch(ddp_rank, 2, torch.bfloat16, reduce_dtype):
        assert distance(trace.params, ref.params) < PATH_TOL[torch.bfloat16] * distance(
            start, ref.params
        )
        element = 4 if reduce_dtype is torch.float32 else 2
        assert payload == STEPS * element * psi
        assert dtypes == {torch.bfloat16, torch.float32}  # compute copies and masters


@pytest.mark.parametrize("overflows", [(), (3,), (0, 5)])
def test_the_scale_stops_at_the_largest_finite_float32_like_grad_scaler(overflows):
    """Growing from 2^124 every step: GradScaler stops at 2^127 (2^128 is inf in float32)
    instead of overflowing and then oscillating; step for step the same scales."""
    steps, init = 9, 2.0**124
    scaler = DynamicLossScaler(init_scale=init, growth_interval=1)
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.1)
    scales = []
    for step in range(steps):
        opt.zero_grad()
        scaler.scale(p.sum()).backward()
        if step in overflows:
            p.grad[0] = float("inf")
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    expected = grad_scaler_scales(steps, overflows, init_scale=init, growth_interval=1)
    assert scales == expected
    assert max(scales) == 2.0**127 and all(s < float("inf") for s in scales)


def found_inf_rank():
    """The bytes of `unscale_`'s found-inf all-reduce, from the ledger."""
    scaler = DynamicLossScaler()
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3)
    opt = torch.optim.SGD([p], lr=0.1)
    with minidist.comm.record() as ledger:
        scaler.unscale_(opt)
    return ledger.total_ring_bytes()


@pytest.mark.parametrize("world", [3, 4])
def test_found_inf_costs_one_ring_all_reduce_of_a_float(world):
    """2(N-1)/N · 4 bytes per rank per step, whatever the model (4 bytes only at N = 2)."""
    for sent in minidist.launch(found_inf_rank, world):
        assert sent == pytest.approx(theory.found_inf_bytes(world))
        assert sent == pytest.approx(2 * (world - 1) / world * 4)
