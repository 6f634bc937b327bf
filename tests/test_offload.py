"""Offloading the optimizer changes where the state lives, not the training."""

import os

import numpy as np
import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

import minidist
from minidist.data_parallel.fixture import build, trainable_params
from minidist.fsdp import theory as fsdp_theory
from minidist.fsdp.lesson import GRAD_TOL, PARAM_TOL
from minidist.offload import OffloadOptimizer, theory
from minidist.offload.fixture import disk_files_on_rank, train_on_rank
from minidist.offload.lesson import formula
from minidist.training import max_abs_diff
from minidist.zero.fixture import reference


@pytest.mark.parametrize("tier", ["cpu", "disk"])
def test_offload_equals_training_on_the_device(tier, tmp_path):
    """The same Adam on the same fp32 values, only elsewhere: identical results."""
    on_device = minidist.launch(train_on_rank, 2, None)
    offloaded = minidist.launch(train_on_rank, 2, tier, str(tmp_path))
    ref = reference("gpt")
    for (dev, dev_info), (trace, info) in zip(on_device, offloaded):
        assert max_abs_diff(trace.params, dev.params) == 0.0
        assert trace.losses == dev.losses
        # and so equal to one process within FSDP's tolerances (tests/test_fsdp.py)
        assert max_abs_diff(trace.grads, ref.grads) < GRAD_TOL
        assert max_abs_diff(trace.params, ref.params) < PARAM_TOL
        owned = info["owned"]  # elements of this rank's chunks
        # fp32 both ways: gradients down, parameters up (ZeRO-Offload: 4Ψ in mixed precision)
        assert info["moved_per_step"] == theory.bytes_moved_per_step(owned)
        # every tier, every kind of state, measured per storage / per file == the formula
        assert info["tiers"] == formula(info, tier)
        assert dev_info["tiers"] == formula(dev_info, "device")
        assert info["optimizer_device"] == {"params": 4 * owned, "grads": 4 * owned, "optimizer": 0}
        # offload adds bus traffic, not network traffic: FSDP's collectives are unchanged
        assert info["sent_per_step"] == dev_info["sent_per_step"]
        if tier == "disk":
            assert len(info["files"]) == 2 * info["tensors"]  # two moments per chunk
            assert (
                sum(info["files"].values()) == theory.tier_bytes(owned, "disk")["disk"]["optimizer"]
            )
    assert os.listdir(tmp_path) == []  # the disk tier's files are gone after the run


def test_collectives_are_fsdps():
    """The ledger of an offloaded run is FSDP's 3(N-1)/N·Ψ (root gathered once)."""
    gpt = build("gpt").model
    blocks = [sum(p.numel() for p in b.parameters() if p.requires_grad) for b in gpt.blocks]
    numels = [*blocks, trainable_params(gpt) - sum(blocks)]  # FSDP's units, the root last
    expected = fsdp_theory.bytes_sent_per_step(numels, 4)
    for _, info in minidist.launch(train_on_rank, 4, "cpu"):
        assert info["sent_per_step"] == pytest.approx(sum(expected.values()))


def test_disk_files_hold_the_state_and_go_away(tmp_path):
    results = minidist.launch(disk_files_on_rank, 2, str(tmp_path))
    assert len({r["directory"] for r in results}) == 2  # a directory of its own per rank
    for r in results:
        assert r["sizes"] == {
            f"{i}.{m}": 4 * n for i, n in enumerate(r["owned"]) for m in ("exp_avg", "exp_avg_sq")
        }
        assert all(r["file_equals_state"].values())  # read from disk == the optimizer's state
        assert all(r["nonzero"].values())  # and Adam did write into the files
        assert not r["exists_after_close"]
    assert os.listdir(tmp_path) == []


def test_tier_bytes_formula():
    n, t, f = 100, 3, 7
    dev = theory.tier_bytes(n, "device", t, f)
    assert theory.totals(dev) == {
        "device": 4 * (n + f) + 4 * n + 8 * n + 4 * t,
        "host": 0,
        "disk": 0,
    }
    cpu = theory.totals(theory.tier_bytes(n, "cpu", t, f))
    assert cpu == {"device": 4 * (n + f) + 4 * n, "host": 16 * n + 4 * t, "disk": 0}
    disk = theory.totals(theory.tier_bytes(n, "disk", t, f))
    assert disk == {"device": 4 * (n + f) + 4 * n, "host": 8 * n + 4 * t, "disk": 8 * n}
    # mixed precision on the device: ZeRO's 2 + 2 + 12 bytes per parameter
    assert sum(theory.totals(theory.tier_bytes(n, "device", 0, 0, 2, 2)).values()) == 16 * n
    with pytest.raises(ValueError, match="placement must be one of"):
        theory.tier_bytes(n, "nvme")


def test_bytes_moved_is_zero_offloads_4psi_in_mixed_precision():
    assert sum(theory.bytes_moved_per_step(10, 2, 2).values()) == 4 * 10
    assert theory.bytes_moved_per_step(10) == {"device_to_host": 40, "host_to_device": 40}
    assert theory.disk_bytes_per_step(10) == {"disk_to_host": 80, "host_to_disk": 80}


def test_placement_options_zero_offload_is_the_cheapest_cut():
    """ZeRO-Offload section 3: with forward and backward on the GPU, offloading anything
    moves at least 4Ψ; among the placements that move only 4Ψ, ZeRO-Offload leaves the GPU
    the least (2Ψ, the fp16 parameters)."""
    psi = 1e9
    rows = {r["placement"]: r for r in theory.placement_options(psi)}
    everything = rows["everything on the GPU"]
    assert (everything["gpu_bytes"], everything["bus_bytes"]) == (16 * psi, 0)
    zo = rows["+ fp16 gradients on the CPU (ZeRO-Offload)"]
    assert (zo["gpu_bytes"], zo["cpu_bytes"], zo["bus_bytes"]) == (2 * psi, 14 * psi, 4 * psi)
    offloading = [r for r in rows.values() if r["forward_backward"] == "gpu" and r["on_cpu"]]
    assert min(r["bus_bytes"] for r in offloading) == 4 * psi
    at_minimum = [r for r in offloading if r["bus_bytes"] == 4 * psi]
    assert min(at_minimum, key=lambda r: r["gpu_bytes"]) is zo
    assert rows["Adam's moments on the CPU, update on the GPU"]["bus_bytes"] == 16 * psi
    assert rows["+ fp16 parameters on the CPU"]["bus_bytes"] == 6 * psi


def test_tier_bytes_measured_on_a_plain_module(tmp_path):
    """Without FSDP: storages counted once, files by their size, counters on the host."""
    model = nn.Linear(4, 3)
    opt = OffloadOptimizer(model.parameters(), tier="disk", path=str(tmp_path), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    n = sum(p.numel() for p in model.parameters())
    assert opt.tier_bytes() == theory.tier_bytes(n, "disk", tensors=2)
    assert opt.file_sizes() == {
        "0.exp_avg": 48,
        "0.exp_avg_sq": 48,
        "1.exp_avg": 12,
        "1.exp_avg_sq": 12,
    }
    on_disk = np.fromfile(os.path.join(opt.directory, "0.exp_avg"), dtype=np.float32)
    assert np.array_equal(on_disk, opt.state[opt.masters[0]]["exp_avg"].reshape(-1).numpy())
    assert not opt.pinned and not opt.on_cuda  # nothing pinned, no CUDA call on a CPU
    opt.close()
    assert os.listdir(tmp_path) == []


def test_the_disk_tier_never_maps_an_existing_file(tmp_path):
    """A fresh directory per optimizer, and a file that exists anyway is refused."""
    p = [nn.Parameter(torch.ones(3))]
    a = OffloadOptimizer(p, tier="disk", path=str(tmp_path), lr=0.1)
    b = OffloadOptimizer(p, tier="disk", path=str(tmp_path), lr=0.1)
    assert a.directory != b.directory
    with pytest.raises(FileExistsError):
        a._file("0.exp_avg", p[0])  # the name a's first moment already has
    a.close()
    b.close()
    assert os.listdir(tmp_path) == []


def test_bad_input_is_named_before_any_state(tmp_path):
    p = [nn.Parameter(torch.ones(3))]
    with pytest.raises(ValueError, match="tier must be one of"):
        OffloadOptimizer(p, tier="nvme")
    with pytest.raises(ValueError, match="SGD is not supported there"):
        OffloadOptimizer(p, torch.optim.SGD, tier="disk", lr=0.1)
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(ValueError, match="is not a writable directory"):
        OffloadOptimizer(p, tier="disk", path=str(not_a_dir))
    assert os.listdir(tmp_path) == ["file"]


# -- the contract over a range: dtypes, shapes, steps, which parameters get a gradient --------

SHAPES = st.lists(st.lists(st.integers(1, 5), min_size=1, max_size=3), min_size=1, max_size=3)


@settings(max_examples=10, deadline=None)
@given(shapes=SHAPES, steps=st.integers(1, 4), tier=st.sampled_from(["cpu", "disk"]))
def test_bf16_parameters_are_stepped_through_fp32_masters(shapes, steps, tier):
    """Mixed precision (ZeRO-Offload, section 4): bf16 parameters on the device, fp32 masters
    and Adam on the host, the masters rounded back to bf16 after each step. Equal, bit for
    bit, to Adam on fp32 copies rounded to bf16; 2 bytes per element each way."""
    g = torch.Generator().manual_seed(len(shapes) * 10 + steps)
    init = [torch.randn(s, generator=g) for s in shapes]
    params = [nn.Parameter(t.to(torch.bfloat16)) for t in init]
    masters = [nn.Parameter(p.detach().float()) for p in params]
    opt = OffloadOptimizer(params, tier=tier, lr=0.1)
    ref = torch.optim.Adam(masters, lr=0.1)
    for _ in range(steps):
        for p, m in zip(params, masters):
            grad = torch.randn(p.shape, generator=g).to(torch.bfloat16)
            p.grad, m.grad = grad, grad.float()
        opt.step()
        ref.step()
        for p, m in zip(params, masters):
            assert p.dtype == torch.bfloat16
            assert torch.equal(p.detach(), m.detach().to(torch.bfloat16))
    assert all(m.dtype == torch.float32 for m in opt.masters)
    assert all(torch.equal(a, b.detach()) for a, b in zip(opt.masters, masters))
    n = sum(p.numel() for p in params)
    assert opt.moved == {k: steps * v for k, v in theory.bytes_moved_per_step(n, 2, 2).items()}
    opt.close()


@settings(max_examples=10, deadline=None)
@given(
    masks=st.lists(st.lists(st.booleans(), min_size=3, max_size=3), min_size=2, max_size=5),
    tier=st.sampled_from(["cpu", "disk"]),
)
def test_a_parameter_without_a_gradient_is_not_stepped(masks, tier):
    """A step where a parameter has no gradient leaves it (and its Adam state) alone, as
    torch's optimizers do, instead of stepping it again with an earlier step's gradient."""
    g = torch.Generator().manual_seed(len(masks))
    shapes = [(3, 2), (4,), (1,)]
    params = [nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
    plain = [nn.Parameter(p.detach().clone()) for p in params]
    opt = OffloadOptimizer(params, tier=tier, lr=0.1)
    ref = torch.optim.Adam(plain, lr=0.1)
    for mask in masks:
        opt.zero_grad()
        ref.zero_grad()
        for p, q, has_grad in zip(params, plain, mask):
            if has_grad:
                grad = torch.randn(p.shape, generator=g)
                p.grad, q.grad = grad.clone(), grad.clone()
        opt.step()
        ref.step()
        assert all(torch.equal(p.detach(), q.detach()) for p, q in zip(params, plain))
    opt.close()


def test_bytes_moved_are_gradients_down_and_parameters_up():
    """ZeRO-Offload, section 4: the gradients go to the host (their bytes), the updated
    parameters come back (theirs): fp32 gradients of bf16 parameters move 4 + 2 bytes."""
    assert theory.bytes_moved_per_step(10, param_bytes=2, grad_bytes=4) == {
        "device_to_host": 40,
        "host_to_device": 20,
    }
