"""Lesson 19's simulated FP8 training (arXiv:2412.19437 §3.3): the quantization, the promoted
GEMM, the FP8 linear's three GEMMs, the outlier experiment, and a converted transformers
model alone and under lesson 17's `parallelize`.

Bounds come from E4M3's unit roundoff u = 2^-4 (3 stored significand bits, round to nearest):
|q·s − x| ≤ u·|x| for a normal, ≤ 2^-10·s (half the smallest subnormal 2^-9, times the
scale) for a subnormal. The simulated accumulator truncates to 14 significant bits, so each
addition errs by less than 2^-13 of the running sum: over n additions, (n − 1)·2^-13·Σ|a·b|.
"""

import hf_models
import hf_runs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from worlds import HUNG_S

import minidist
from minidist.compose.dims import Grid, ParallelDims
from minidist.compose.fixture import data_rows, one_step
from minidist.compose.parallelize import parallelize
from minidist.deepseek.fp8 import (
    E4M3_MAX,
    Fp8Config,
    Fp8Linear,
    convert_to_fp8_training,
    fp8_matmul,
    quantize,
)
from minidist.deepseek.fp8_experiments import error_table

U = 2.0**-4  # E4M3's unit roundoff
SUBNORMAL = 2.0**-10  # half E4M3's smallest subnormal: the largest absolute rounding error
ACC = 2.0**-13  # the 14-bit accumulator's relative error per addition (truncation)
BLOCKS = [(1, 128), (128, 128), (128, 1), None]


def _quantization_error_bound(x: torch.Tensor, q) -> torch.Tensor:
    return U * x.abs() + SUBNORMAL * q.expanded_scale()


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 5),
    cols=st.sampled_from([1, 5, 127, 128, 129, 200, 384, 1000]),
    block=st.sampled_from(BLOCKS),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]),
    zero_tile=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_quantize_round_trip_and_scales(rows, cols, block, dtype, zero_tile, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * 10.0 ** torch.randint(-3, 4, (1,), generator=g)
    if zero_tile:
        x[:, :128] = 0
    x = x.to(dtype)
    q = quantize(x, block)
    br, bc = block or (rows, cols)
    assert q.data.dtype == torch.float8_e4m3fn and q.data.shape == x.shape
    assert q.scale.dtype == torch.float32 and q.scale.shape == (-(-rows // br), -(-cols // bc))
    data, xf = q.data.float(), x.float()
    for i in range(q.scale.shape[0]):
        for j in range(q.scale.shape[1]):
            tile = (slice(i * br, (i + 1) * br), slice(j * bc, (j + 1) * bc))
            amax = xf[tile].abs().max()
            if amax == 0:  # an all-zero tile: scale 1, values 0, no NaN
                assert q.scale[i, j] == 1 and (data[tile] == 0).all()
            else:  # each tile's largest magnitude maps to E4M3's largest, 448
                assert data[tile].abs().max() == E4M3_MAX
                assert q.scale[i, j] == pytest.approx(float(amax) / E4M3_MAX, rel=1e-6)
    err = (q.dequantize() - xf).abs()
    assert (err <= _quantization_error_bound(xf, q) * (1 + 1e-6)).all()


def _exact_product_bound(a, b, qa, qb):
    """|deq(a)·deq(b) − a·b| elementwise, from each factor's rounding bound."""
    ea, eb = _quantization_error_bound(a, qa), _quantization_error_bound(b, qb)
    return ea @ b.abs() + a.abs() @ eb + ea @ eb


@settings(max_examples=12, deadline=None)
@given(
    m=st.integers(1, 5),
    k=st.sampled_from([100, 128, 300, 512]),
    n=st.integers(1, 7),
    tile_wise=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_promoted_gemm_within_e4m3_bound(m, k, n, tile_wise, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g, dtype=torch.float64)
    b = torch.randn(k, n, generator=g, dtype=torch.float64)
    qa = quantize(a.float(), (1, 128) if tile_wise else None)
    qb = quantize(b.float(), (128, 128) if tile_wise else None)
    got = fp8_matmul(qa, qb).double()
    deq = qa.dequantize().double() @ qb.dequantize().double()
    # the accumulation alone: 127 truncations per 128-slice, then float32 adds (2^-24 each)
    size = qa.dequantize().double().abs() @ qb.dequantize().double().abs()
    accumulation = (127 * ACC + k * 2.0**-24) * size
    assert ((got - deq).abs() <= accumulation).all()
    # against float64 of the inputs: the quantization's bound on top
    bound = accumulation + _exact_product_bound(a, b, qa, qb)
    assert ((got - a @ b).abs() <= bound).all()
    # float32 accumulation (no truncation) is the dequantized product to float32 rounding
    exact = fp8_matmul(qa, qb, accumulator_bits=None).double()
    assert ((exact - deq).abs() <= k * 2.0**-24 * size).all()


def test_promotion_bounds_the_accumulation_error_at_large_k():
    """K = 4096: without promotion the 14-bit sum errs by several %, with it by < 0.1%."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 4096, generator=g), torch.randn(4096, 16, generator=g)
    qa, qb = quantize(a, (1, 128)), quantize(b, (128, 128))
    exact = fp8_matmul(qa, qb, accumulator_bits=None)

    def rel(y):
        return float((y - exact).norm() / exact.norm())

    promoted, unpromoted = rel(fp8_matmul(qa, qb)), rel(fp8_matmul(qa, qb, promote_every=None))
    assert promoted < 1e-3 < 2e-2 < unpromoted  # measured 5e-4 and 9e-2


def test_outlier_error_table_ordering():
    """Tile-wise scaling isolates an outlier channel that per-tensor scaling spreads over
    every value; bf16 (8 bits) beats both FP8s (4 bits)."""
    for row in error_table(ks=(256, 1024)):
        assert row["bf16"] < row["fp8 tile-wise, promoted"] < row["fp8 per-tensor, promoted"] / 2


def _linear_pair(seed=0, bias=True):
    torch.manual_seed(seed)
    ref = torch.nn.Linear(200, 300, bias=bias)
    fp8 = torch.nn.Linear(200, 300, bias=bias)
    fp8.load_state_dict(ref.state_dict())
    return ref, fp8


def _run(layer, x, dy):
    x = x.clone().requires_grad_()
    y = layer(x)
    y.backward(dy)
    return y.detach(), x.grad, layer.weight.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_linear_three_gemms_take_the_papers_fp8_inputs(dtype):
    """Fprop: x 1×128 tiles, W 128×128 blocks; Dgrad: dY 1×128, W 128×128; Wgrad: dY and x in
    128×1 tiles along the tokens (Figure 6). With float32 accumulation and output each GEMM
    is the float64 product of those dequantized inputs to float32 rounding (rel. 1e-5), so
    any other tiling, scale or missing quantization shows."""
    _, layer = _linear_pair(bias=False)
    layer = layer.to(dtype)
    exact = Fp8Config(accumulator_bits=None, output_dtype=torch.float32)
    convert_to_fp8_training(torch.nn.Sequential(layer), exact)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 70, 200, generator=g).to(dtype)
    dy = torch.randn(3, 70, 300, generator=g).to(dtype)
    y, dx, dw = _run(layer, x, dy)
    x2, dy2 = x.reshape(-1, 200).float(), dy.reshape(-1, 300).float()
    w = layer.weight.detach().float()

    def deq(t, block):
        return quantize(t, block).dequantize().double()

    def close(got, want):
        got = got.double().reshape(want.shape)
        tol = 1e-5 if dtype == torch.float32 else 2.0**-8  # bf16 keeps 8 bits
        assert float((got - want).abs().max()) <= tol * float(want.abs().max())

    close(y, deq(x2, (1, 128)) @ deq(w, (128, 128)).t())
    close(dx, deq(dy2, (1, 128)) @ deq(w, (128, 128)))
    close(dw, deq(dy2, (128, 1)).t() @ deq(x2, (128, 1)))


def test_fp8_linear_close_to_float32():
    """Default config (14-bit accumulator, bf16 outputs) against float32: output, input and
    weight gradients within E4M3's elementwise bound (2 roundings: (2u + u²)·|x|·|w| plus the
    subnormal terms, 127·2^-13 for the accumulation, 2^-8 relative for bf16 outputs), and
    their norm-wise relative error near e4m3's RMS rounding (measured 3.6%; bound 6%, and
    above 1%, so that a float32 fall-back fails)."""
    ref, layer = _linear_pair()
    convert_to_fp8_training(torch.nn.Sequential(layer))
    assert isinstance(layer, Fp8Linear)
    g = torch.Generator().manual_seed(2)
    x, dy = torch.randn(2, 90, 200, generator=g), torch.randn(2, 90, 300, generator=g)
    got, want = _run(layer, x, dy), _run(ref, x, dy)
    x2, dy2, w = x.reshape(-1, 200), dy.reshape(-1, 300), ref.weight.detach()
    sizes = (x2.abs() @ w.abs().t(), dy2.abs() @ w.abs(), dy2.abs().t() @ x2.abs())
    for got_t, want_t, size, bf16 in zip(got, want, sizes, (True, True, False), strict=True):
        got_t, want_t = got_t.reshape(size.shape), want_t.reshape(size.shape)
        # the subnormal terms are at most 2^-10·448·u-scaled maxima: bounded by u·size here
        bound = (2 * U + U * U + 2 * U + 127 * ACC) * size + (2.0**-8 if bf16 else 0) * want_t.abs()
        assert ((got_t - want_t).abs() <= bound).all()
        rel = float((got_t - want_t).norm() / want_t.norm())
        assert 0.01 < rel < 0.06


def test_converted_llama_keeps_its_state_dict_and_head():
    model = hf_models.build("llama")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids, labels = hf_models.batches(1, 4, 16)[0]
    want = model(input_ids=ids, labels=labels).loss
    assert convert_to_fp8_training(model) is model
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[k], before[k]) for k in before)
    kinds = {n: type(m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert kinds.pop("lm_head") is torch.nn.Linear  # the head stays in float32
    assert kinds and all(k is Fp8Linear for k in kinds.values())
    got = model(input_ids=ids, labels=labels).loss
    assert got.item() == pytest.approx(want.item(), rel=0.02)  # measured 2e-4
    got.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_converted_deepseek_v3_keeps_router_and_head():
    model = convert_to_fp8_training(hf_models.build("deepseek_v3"))
    converted = {n for n, m in model.named_modules() if isinstance(m, Fp8Linear)}
    assert "lm_head" not in converted and not any(n.endswith("gate") for n in converted)
    assert "model.layers.0.self_attn.q_a_proj" in converted
    ids, labels = hf_models.batches(1, 2, 16)[0]
    model(input_ids=ids, labels=labels).loss.backward()


BATCH, SEQ = 16, 16  # 8 rows of 16 tokens per rank: Wgrad's 128-token tiles are a rank's


def _converted_llama():
    return convert_to_fp8_training(hf_models.build("llama"))


def _composed_dp2(steps):
    dims = ParallelDims(dp_shard=2)
    grid = Grid(dims)
    engine = parallelize(
        _converted_llama(), dims, grid=grid, microbatches=1, seq_len=SEQ, lr=hf_runs.LR
    )
    rows = list(data_rows(grid, BATCH))
    losses = [
        one_step(engine, grid, ids[rows], hf_runs.shifted(labels)[rows])[0]
        for ids, labels in hf_models.batches(steps, BATCH, SEQ)
    ]
    return losses, engine.full_parameters()


def test_converted_llama_under_parallelize_dp2_equals_one_process():
    """dp_shard = 2 (ZeRO-1 over 2 ranks) against the converted model in one process: each
    rank's 128 tokens are one Wgrad tile of the one-process batch, so the FP8 roundings are
    the same and the runs differ by float32 summation order only; tolerances lesson 17's
    fp32 ones (losses 1e-5, parameters 1e-3)."""
    steps = 3
    model = _converted_llama()
    opt = torch.optim.Adam(model.parameters(), lr=hf_runs.LR)
    want = []
    for ids, labels in hf_models.batches(steps, BATCH, SEQ):
        opt.zero_grad()
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        want.append(loss.item())
    results = minidist.launch(_composed_dp2, 2, steps, timeout_s=300, idle_s=HUNG_S)
    for losses, params in results:
        assert losses == pytest.approx(want, abs=1e-5)
        for name, p in model.named_parameters():
            assert float((params[name] - p.detach()).abs().max()) < 1e-3, name


def test_loss_curves_and_plots():
    """Three steps of the tiny Llama per mode: the same first loss to within FP8's noise
    (measured 3e-4 relative; bound 1e-2), and the plots draw."""
    import matplotlib

    matplotlib.use("Agg")
    from minidist.deepseek.fp8_experiments import loss_curves, relative_loss_difference
    from minidist.deepseek.plots_fp8 import plot_error_table, plot_fp8_loss_curves

    curves = loss_curves(steps=3, batch=2, seq=16)
    assert set(curves) == {"float32", "bf16", "fp8"}
    assert relative_loss_difference(curves["fp8"], curves["float32"])[0] < 1e-2
    assert curves["fp8"] != curves["float32"]  # the FP8 path ran
    plot_fp8_loss_curves(curves)
    plot_error_table(error_table(ks=(256,)))
