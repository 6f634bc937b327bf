"""Mixed precision on FSDP tracks fp32; the loss scaler follows GradScaler on every rank."""

import pytest
import torch
import torch.nn as nn

import minidist
from minidist.data_parallel.fixture import build
from minidist.mixed_precision import DynamicLossScaler, MixedPrecision, divide_factors
from minidist.mixed_precision.fixture import train_on_rank
from minidist.zero.fixture import reference

# bf16 keeps 8 significant bits (relative rounding 2^-9 ≈ 2e-3 per operation), fp16 11 bits:
# the GPT's loss (about 3.4) then differs from fp32 by about 1e-3 (bf16) and 1e-4 (fp16)
# over 5 steps. Parameters are compared as a whole, against how far fp32 training moved
# them: single elements with near-zero gradients can take an Adam step of the other sign
# (±lr), and lr = 1e-2 is as large as the weights themselves. Measured: bf16 6%, fp16 3%
# of the distance travelled (fp32 through the same code: 1e-5).
LOSS_TOL = {torch.bfloat16: 5e-3, torch.float16: 1e-3}
PATH_TOL = {torch.bfloat16: 0.15, torch.float16: 0.08}


def distance(a: dict, b: dict) -> float:
    return sum(float((a[k] - b[k]).pow(2).sum()) for k in b) ** 0.5


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
    torch_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=2)
    p = nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.1)
    expected = []
    for step in range(len(results[0]["scales"])):
        opt.zero_grad()
        torch_scaler.scale(p.sum()).backward()
        if step in overflows:
            p.grad[0] = float("inf")
        torch_scaler.step(opt)
        torch_scaler.update()
        expected.append(torch_scaler.get_scale())
    for r in results:
        assert r["scales"] == expected
        assert r["stepped"] == [s not in overflows for s in range(len(expected))]
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
    with pytest.raises(ValueError, match="growth_factor > 1"):
        DynamicLossScaler(growth_factor=1.0)
    scaler = DynamicLossScaler()
    with pytest.raises(RuntimeError, match="needs a step"):
        scaler.update()


@pytest.mark.parametrize("world", [1, 2, 4, 8, 16, 6])
def test_divide_factors_split_n(world):
    pre, post = divide_factors(world)
    assert pre * post == world and pre <= post and world % pre == 0


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
