"""Recomputation equals running without it (dropout included) and keeps what the theory says."""

import pytest
import torch
import torch.distributed as dist
import torch.utils.checkpoint as torch_checkpoint

import minidist
from minidist.data import shard_batch
from minidist.data_parallel.fixture import build
from minidist.fsdp import FullyShardedDataParallel
from minidist.fsdp.fixture import UNITS
from minidist.recompute import recompute, theory
from minidist.recompute.fixture import DROPOUT_GPT, block_bytes, saved_and_grads
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
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    values = dict(line.split("=") for line in out.stdout.split())
    peaks = [float(v) for k, v in values.items() if k.endswith("_peak_kib")]
    assert len(peaks) == 7  # no speed is asserted; bytes must shrink down the list
    assert peaks == sorted(peaks, reverse=True)
