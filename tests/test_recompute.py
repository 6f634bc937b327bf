"""Recomputation equals running without it (dropout included) and keeps what the theory says."""

import pytest
import torch
import torch.distributed as dist
import torch.utils.checkpoint as torch_checkpoint
from hypothesis import given, settings
from hypothesis import strategies as st

import minidist
from minidist.data import shard_batch
from minidist.data_parallel.fixture import build
from minidist.fsdp import FullyShardedDataParallel
from minidist.fsdp.fixture import UNITS
from minidist.recompute import recompute, theory
from minidist.recompute.fixture import (
    DROPOUT_GPT,
    block_bytes,
    gpt_forward,
    linear_chain,
    saved_and_grads,
)
from minidist.training import max_abs_diff, train
from minidist.zero.fixture import ADAM


def test_recompute_equals_plain_with_dropout_exactly():
    """The recomputation runs the same ops with the same dropout masks: bit for bit."""
    _, plain = saved_and_grads("plain")
    _, recomputed = saved_and_grads("recompute")
    assert max_abs_diff(recomputed, plain) == 0.0


def test_equals_torch_utils_checkpoint():
    model, batches, loss_fn = build("gpt", **DROPOUT_GPT)
    model.train()
    for block in model.blocks:
        plain = block.forward
        block.forward = lambda x, f=plain: torch_checkpoint.checkpoint(f, x, use_reentrant=True)
    torch.manual_seed(123)
    loss_fn(model(batches[0][0]), batches[0][1]).backward()
    torch_grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    _, ours = saved_and_grads("recompute")
    assert max_abs_diff(ours, torch_grads) == 0.0


@pytest.mark.parametrize("segment", [None, 1, 2, 4])
def test_saved_bytes_equal_the_theory(segment):
    """Forward keeps L·a without recomputation, ⌈L/k⌉·b with segments of k (Chen et al.),
    plus what the embedding, final norm and head keep either way."""
    layers = DROPOUT_GPT["layers"]
    a, b = block_bytes()
    plain, _ = saved_and_grads("plain")
    outside_blocks = plain - layers * a
    measured, grads = saved_and_grads("segments" if segment else "plain", segment)
    assert measured == outside_blocks + theory.saved_bytes(layers, a, b, segment)["forward"]
    assert max_abs_diff(grads, saved_and_grads("plain")[1]) == 0.0


def test_best_segment_is_near_sqrt_l():
    assert theory.best_segment(16, activation=100, boundary=100) == 4
    assert theory.best_segment(64, activation=1, boundary=1) == 8
    with pytest.raises(ValueError, match="segment must be >= 1"):
        theory.saved_bytes(4, 1, 1, 0)


def fsdp_recompute_rank():
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build("gpt")
    for block in model.blocks:
        recompute(block)
    fsdp = FullyShardedDataParallel(model, wrap=UNITS["gpt"])
    opt = torch.optim.Adam(fsdp.sharded_parameters(), **ADAM)
    return train(fsdp, [shard_batch(b, rank, world) for b in batches], loss_fn, opt)


def test_composes_with_fsdp_units():
    """Each block is both an FSDP unit and recomputed: its pre-backward hook re-gathers the
    parameters into the storage the forward's views point at, then the block is recomputed."""
    from minidist.zero.fixture import reference

    ref = reference("gpt")
    for trace in minidist.launch(fsdp_recompute_rank, 2):
        assert max_abs_diff(trace.grads, ref.grads) < 1e-6  # as in tests/test_fsdp.py
        assert max_abs_diff(trace.params, ref.params) < 1e-4


def test_recompute_twice_is_refused():
    model = build("gpt").model
    recompute(model.blocks[0])
    with pytest.raises(ValueError, match="already recomputed"):
        recompute(model.blocks[0])
    names = [n for n, _ in model.named_parameters()]
    assert names == [n for n, _ in build("gpt").model.named_parameters()]  # names kept


def test_bench_memory_prints_every_setup():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "minidist", "bench", "memory", "--world-size", "2", "--steps", "2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    values = dict(line.split("=") for line in out.stdout.split())
    peaks = [float(v) for k, v in values.items() if k.endswith("_peak_kib")]
    assert len(peaks) == 7  # no speed is asserted; bytes must shrink down the list
    assert peaks == sorted(peaks, reverse=True)


# -- the formulas of a transformer layer, the exact peak, the measuring tools -----------------


def test_layer_terms_add_up_to_korthikanti():
    for s, b, h, a in [(2048, 1, 12288, 96), (16, 8, 32, 2), (64, 3, 48, 4)]:
        terms = theory.layer_activation_terms(s, b, h, a)
        assert sum(terms.values()) == theory.transformer_layer_activation_bytes(s, b, h, a)


@pytest.mark.parametrize("dropout", [True, False])
def test_a_block_saves_what_the_course_layout_says(dropout):
    """fp32 on a CPU: with dropout the math attention kernel (a·s²·b matrices, a float32
    mask), without it the flash kernel; per module, the parts add up to the whole."""
    from minidist.recompute.fixture import block_saved_by_module, gpt_dims

    d = gpt_dims(**DROPOUT_GPT)
    by_module = block_saved_by_module(dropout)
    expected = theory.course_block_bytes(d["seq"], d["batch"], d["hidden"], d["heads"], dropout)
    assert sum(by_module.values()) == expected
    if dropout:
        assert sum(by_module.values()) == block_bytes()[0]
    assert by_module["mlp.1"] == 4 * 4 * d["seq"] * d["batch"] * d["hidden"]  # GeLU input


@pytest.mark.parametrize("segment", [None, 1, 2, 3, 4])
def test_live_peak_of_a_chain_of_blocks_is_exact(segment):
    """Measured over forward and backward: forward keeps ⌈L/k⌉ inputs; the peak is the exact
    count (never above Chen et al.'s), the recomputed segment's input counted once."""
    from minidist.recompute.fixture import block_chain

    a, b = block_bytes()
    got = block_chain(4, segment)
    assert got["forward"] == theory.saved_bytes(4, a, b, segment)["forward"]
    assert got["peak"] == theory.chain_peak_bytes(4, a, b, segment)
    assert got["peak"] <= theory.saved_bytes(4, a, b, segment)["peak"]


@pytest.mark.parametrize("layers, segment", [(16, 4), (16, 5), (9, 3), (9, None)])
def test_live_peak_of_a_linear_chain_follows_sqrt_l(layers, segment):
    from minidist.recompute.fixture import linear_chain

    b = 16 * 64 * 4  # Linear(64, 64) on 16 rows keeps its input only: a = b
    assert linear_chain(layers, segment)["peak"] == theory.chain_peak_bytes(layers, b, b, segment)


def test_saved_by_part_adds_up_and_recompute_keeps_block_inputs():
    from minidist.recompute.fixture import saved_by_part

    a, b = block_bytes()
    plain, recomputed = saved_by_part("plain"), saved_by_part("recompute")
    assert sum(plain.values()) == saved_and_grads("plain")[0]
    for i in range(DROPOUT_GPT["layers"]):
        assert (plain[f"block {i}"], recomputed[f"block {i}"]) == (a, b)
    outside = [p for p in plain if not p.startswith("block")]
    assert all(plain[p] == recomputed[p] for p in outside)


def test_recomputed_training_is_the_reference_bit_for_bit():
    from minidist.recompute.fixture import train_recomputed
    from minidist.zero.fixture import reference

    ref, got = reference("gpt"), train_recomputed()
    assert max_abs_diff(got.grads, ref.grads) == 0.0
    assert max_abs_diff(got.params, ref.params) == 0.0


@pytest.mark.parametrize("how", ["recompute", "segments"])
def test_the_recomputation_leaves_the_global_rng_where_plain_training_does(how):
    """The recomputed forward draws its dropout masks again from the saved RNG state; after
    backward the global generator must be where the plain run left it, or every later mask
    (the next step's dropout) differs. Three steps of training, bit for bit."""

    def run(kind):
        model, batches, loss_fn = build("gpt", **DROPOUT_GPT)
        model.train()
        if kind == "recompute":
            for block in model.blocks:
                recompute(block)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.manual_seed(7)
        states = []
        for x, y in batches[:3]:
            opt.zero_grad()
            loss_fn(gpt_forward(model, x, 2 if kind == "segments" else None), y).backward()
            states.append(torch.get_rng_state())
            opt.step()
        return states, {n: p.detach().clone() for n, p in model.named_parameters()}

    plain_states, plain_params = run("plain")
    states, params = run(how)
    assert all(torch.equal(a, b) for a, b in zip(states, plain_states))
    assert max_abs_diff(params, plain_params) == 0.0


@settings(max_examples=30, deadline=None)
@given(
    layers=st.integers(1, 12),
    segment=st.integers(1, 20),
    activation=st.integers(1, 100),
    boundary=st.integers(1, 100),
)
def test_saved_bytes_over_every_segment_length(layers, segment, activation, boundary):
    """Chen et al.'s count for any k, also k > L (one segment, the whole model): forward keeps
    ⌈L/k⌉ inputs, backward adds one segment of at most L layers; it bounds the exact chain."""
    got = theory.saved_bytes(layers, activation, boundary, segment)
    n_segments = -(-layers // segment)
    longest = min(segment, layers)
    assert got == {
        "forward": n_segments * boundary,
        "peak": n_segments * boundary + longest * activation,
    }
    if segment >= layers:
        assert got == theory.saved_bytes(layers, activation, boundary, layers)
    exact = theory.chain_peak_bytes(layers, activation, boundary, segment)
    assert exact <= got["peak"]
    assert exact >= longest * activation


@pytest.mark.parametrize("segment", [5, 9])
def test_a_segment_longer_than_the_chain_is_one_segment(segment):
    """Measured: Linear layers (a = b) with k > L keep one input, peak L layers: the theory."""
    layers = 4
    measured = linear_chain(layers, segment)
    a = b = linear_chain(1, None)["forward"]
    assert measured["forward"] == theory.saved_bytes(layers, a, b, segment)["forward"]
    assert measured["peak"] == theory.chain_peak_bytes(layers, a, b, segment)
