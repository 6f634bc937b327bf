"""ZeRO stages 1-2 equal single-process Adam; memory and bytes equal the paper's formulas."""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

import minidist
from minidist.data import shard_batch
from minidist.data_parallel.fixture import STEPS, build
from minidist.training import max_abs_diff
from minidist.zero import FlatShard, ZeroDataParallel, theory
from minidist.zero.fixture import build_args, reference, train_on_rank

# float32: the reduce-scatter sums N partial gradients in another order than one process, a
# few ulps (gradients agree within 1e-7). Adam's step m/sqrt(v) is about ±lr whatever the
# gradient's size, so where a gradient is a near-cancelling sum (GPT embeddings, biases) its
# few-ulp error is a large *relative* error that the step does not shrink: after 5 steps at
# lr = 1e-2 parameters differ by up to 3e-5 on the GPT (6e-8 on the MLP). 1e-4 = 2% of one
# step still fails any real mistake (a missed or doubled gradient moves a parameter by ~lr).
GRAD_TOL, PARAM_TOL = 1e-6, 1e-4
TINY_BUCKETS = dict(bucket_cap_mb=1e-5)  # ~10 bytes: every parameter is its own bucket


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_zero_equals_single_process_adam(name, stage, world):
    ref = reference(name)
    for trace, *_ in minidist.launch(train_on_rank, world, stage, name, **TINY_BUCKETS):
        assert max_abs_diff(trace.grads, ref.grads) < GRAD_TOL
        assert max_abs_diff(trace.params, ref.params) < PARAM_TOL


def test_a_parameter_smaller_than_the_world_leaves_padding_only_shards():
    model = build("mlp", **build_args("mlp")).model
    assert model.layers[2].bias.numel() == 3 < 4
    layouts = [FlatShard([model.layers[2].bias], 4, r) for r in range(4)]
    assert [lay.valid().tolist() for lay in layouts] == [[True], [True], [True], [False]]
    assert layouts[0].padding == 1


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("stage", [1, 2])
def test_ledger_equals_theory(stage, world):
    """Per step: reduce-scatter + all-gather of the padded trainable elements, 2(N-1)/N·Ψ."""
    trace, ledger, _, padded = minidist.launch(train_on_rank, world, stage, "gpt")[0]
    per_step = {op: ledger.total_ring_bytes(op) / STEPS for op in ("reduce_scatter", "all_gather")}
    half = theory.bytes_sent_per_step(padded, world, 0) / 2
    # the contract's full_grads gathers once per step too (a check, not training traffic)
    assert per_step["reduce_scatter"] == pytest.approx(half)
    training = {r.op for r in ledger.records if r.tag != "full-grads"}
    assert training == {"reduce_scatter", "all_gather"}
    sent = sum(r.ring_bytes for r in ledger.records if r.tag != "full-grads") / STEPS
    assert sent == pytest.approx(theory.bytes_sent_per_step(padded, world, stage))


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("stage", [1, 2])
def test_memory_per_rank_equals_the_formula(stage, world):
    model = build("gpt").model
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    _, _, mem, padded = minidist.launch(train_on_rank, world, stage, "gpt")[0]
    formula = theory.fp32_adam_bytes(padded, world, stage)
    n_buckets = 1  # default 25 MiB buckets: the whole small GPT in one
    assert mem.params == formula["params"] + 4 * frozen
    assert mem.grads == formula["grads"]
    assert mem.optimizer == formula["optimizer"] + 4 * n_buckets  # + Adam's step counter
    psi = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert padded - psi < world  # at most N-1 elements of padding per bucket


def groups_rank(gather_weights: str, clip: float | None):
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build("mlp", **build_args("mlp"))
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias") and p.requires_grad]
    zero = ZeroDataParallel(
        model,
        stage=2,
        optimizer_class=torch.optim.AdamW,
        gather_weights=gather_weights,
        param_groups=[{"params": weights, "weight_decay": 0.1}, {"params": biases, "lr": 0.05}],
        lr=1e-2,
        bucket_cap_mb=1e-4,
    )
    norms = []
    for batch in batches:
        x, y = shard_batch(batch, rank, world)
        zero.optimizer.zero_grad()
        loss_fn(zero(x), y).backward()
        if clip is not None:
            norms.append(zero.clip_grad_norm_(clip))
        zero.optimizer.step()
    return zero.full_parameters(), norms


def groups_reference(clip: float | None):
    model, batches, loss_fn = build("mlp", **build_args("mlp"))
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias") and p.requires_grad]
    opt = torch.optim.AdamW(
        [{"params": weights, "weight_decay": 0.1}, {"params": biases, "lr": 0.05}], lr=1e-2
    )
    norms = []
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        if clip is not None:
            norms.append(float(nn.utils.clip_grad_norm_(weights + biases, clip)))
        opt.step()
    return {n: p.detach() for n, p in model.named_parameters()}, norms


@pytest.mark.parametrize("gather_weights", ["after_step", "before_forward"])
@pytest.mark.parametrize("clip", [None, 0.05])
def test_param_groups_gather_timing_and_clipping_equal_one_process(gather_weights, clip):
    ref_params, ref_norms = groups_reference(clip)
    for params, norms in minidist.launch(groups_rank, 4, gather_weights, clip):
        assert max_abs_diff(params, ref_params) < PARAM_TOL
        assert norms == pytest.approx(ref_norms, rel=1e-5)
    if clip is not None:
        assert max(ref_norms) > clip  # the clipping really clipped


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(stage=3), "stage must be 1 or 2"),
        (dict(gather_weights="later"), "gather_weights"),
        (dict(bucket_cap_mb=0), "bucket_cap_mb=0"),
    ],
)
def test_bad_options_are_named(kwargs, words):
    with pytest.raises(ValueError, match=words):
        ZeroDataParallel(nn.Linear(2, 2), **kwargs)  # raised before any collective


def test_param_groups_must_cover_every_parameter_once():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    first = list(model[0].parameters())
    with pytest.raises(ValueError, match=r"missing \['1.weight', '1.bias'\]"):
        ZeroDataParallel(model, param_groups=[{"params": first}])
    with pytest.raises(ValueError, match="0.weight is in groups 0 and 1"):
        ZeroDataParallel(
            model, param_groups=[{"params": first}, {"params": list(model.parameters())}]
        )


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_memory_per_device_reproduces_the_paper(stage):
    """ZeRO Figure 1: Ψ = 7.5B, N = 64, K = 12 -> 120, 31.4, 16.6, 1.9 GB."""
    expected = {0: 120, 1: 31.4, 2: 16.6, 3: 1.9}[stage]
    assert theory.memory_per_device(7.5e9, 64, stage) / 1e9 == pytest.approx(expected, abs=0.05)


def test_theory_rejects_bad_input():
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        theory.memory_per_device(10, 0, 1)
    with pytest.raises(ValueError, match="stage must be one of"):
        theory.bytes_sent_per_step(10, 2, 4)


# -- the gradient division, directly: every rank a different gradient, the step their mean --


class Dot(nn.Module):
    """Σ_i <p_i, g_i>: backward leaves exactly g_i in p_i.grad."""

    def __init__(self, init):
        super().__init__()
        self.ps = nn.ParameterList(nn.Parameter(t.clone()) for t in init)

    def forward(self, grads):
        return sum((p * g).sum() for p, g in zip(self.ps, grads)).float()


def division_rank(cases):
    """Per case (shapes, seed): SGD (lr = 1) steps of ZeroRedundancyOptimizer and of
    ZeroDataParallel (stage 2, fp32 and with bf16 reduction's pre/post split) when every
    rank's gradient is its own; returns the updated parameters."""
    from minidist.mixed_precision import MixedPrecision
    from minidist.zero.optimizer import ZeroRedundancyOptimizer

    rank = dist.get_rank()
    out = []
    for shapes, seed in cases:
        g = torch.Generator().manual_seed(seed)
        init = [torch.randn(s, generator=g) for s in shapes]
        grads = [
            torch.randn(s, generator=torch.Generator().manual_seed(seed + 100 + rank))
            for s in shapes
        ]
        params = [nn.Parameter(t.clone()) for t in init]
        opt = ZeroRedundancyOptimizer(params, torch.optim.SGD, lr=1.0)
        for p, grad in zip(params, grads):
            p.grad = grad.clone()
        opt.step()
        got = {"zero1-optimizer": [p.detach().clone() for p in params]}
        bf16 = MixedPrecision(torch.bfloat16, torch.bfloat16)
        for label, policy in (("stage2", None), ("stage2-mixed", bf16)):
            zero = ZeroDataParallel(
                Dot(init), 2, torch.optim.SGD, mixed_precision=policy, lr=1.0, **TINY_BUCKETS
            )
            zero(grads).backward()  # each parameter's gradient: this rank's own
            zero.finish_gradient_sync()
            zero.optimizer.step()
            got[label] = list(zero.full_parameters().values())
        out.append(got)
    return out


@settings(max_examples=4, deadline=None)
@given(
    world=st.sampled_from([2, 3, 4]),
    shapes=st.lists(st.lists(st.integers(1, 7), min_size=1, max_size=2), min_size=1, max_size=3),
)
def test_gradients_are_divided_by_the_world_once(world, shapes):
    """The step uses the mean of the ranks' gradients: ZeRO-1's optimizer, stage 2's hooks,
    and stage 2 with the mixed-precision split of the division (pre · post = N)."""
    cases = [(shapes, seed) for seed in range(3)]
    results = minidist.launch(division_rank, world, cases)
    for c, (shapes, seed) in enumerate(cases):
        g = torch.Generator().manual_seed(seed)
        init = [torch.randn(s, generator=g) for s in shapes]
        per_rank = [
            [
                torch.randn(s, generator=torch.Generator().manual_seed(seed + 100 + r))
                for s in shapes
            ]
            for r in range(world)
        ]
        mean = [sum(gs[i] for gs in per_rank) / world for i in range(len(shapes))]
        for got in (r[c] for r in results):
            for i, t in enumerate(init):
                assert (got["zero1-optimizer"][i] - (t - mean[i])).abs().max() < 1e-6
                assert (got["stage2"][i] - (t - mean[i])).abs().max() < 1e-6
                # bf16 gradients: their rounding (2^-8 relative), not a factor of N
                assert (got["stage2-mixed"][i] - (t - mean[i])).abs().max() < 3e-2
