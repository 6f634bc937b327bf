"""Offloading the optimizer changes where the state lives, not the training."""

import os

import pytest
import torch
import torch.nn as nn

import minidist
from minidist.offload import OffloadOptimizer
from minidist.offload.fixture import train_on_rank
from minidist.training import max_abs_diff


@pytest.mark.parametrize("tier", ["cpu", "disk"])
def test_offload_equals_training_on_the_device(tier, tmp_path):
    """The same Adam on the same fp32 values, only elsewhere: identical results."""
    on_device = minidist.launch(train_on_rank, 2, None)
    offloaded = minidist.launch(train_on_rank, 2, tier, str(tmp_path))
    for (ref, _), (trace, info) in zip(on_device, offloaded):
        assert max_abs_diff(trace.params, ref.params) == 0.0
        assert trace.losses == ref.losses
        owned = info["owned"]  # elements of this rank's chunks
        # fp32 both ways: gradients down, parameters up (ZeRO-Offload: >= 4Ψ in mixed precision)
        assert info["moved_per_step"] == {"device_to_host": 4 * owned, "host_to_device": 4 * owned}
        resident = info["resident"]
        assert resident["device"] == 8 * owned  # chunks and their gradients
        if tier == "disk":
            assert resident["disk"] == 8 * owned  # Adam's two moments, in files
            assert len(info["files"]) == 2 * 3  # two per unit
        else:
            assert resident["disk"] == 0
            assert resident["host"] >= 16 * owned  # masters, gradients, two moments
    assert os.listdir(tmp_path) == []  # the disk tier's files are gone after the run


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
