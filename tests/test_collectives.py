"""The α-β fit recovers a known model; the all-reduce timer runs on a real world."""

import pytest

import minidist
from minidist import comm
from minidist.collectives.cost_model import CostModel, fit_alpha_beta, time_all_reduce


def test_fit_recovers_alpha_and_bandwidth_exactly():
    truth = CostModel(alpha_s=50e-6, bandwidth_bytes_per_s=2e9)
    sizes = [2**k for k in range(10, 26, 3)]
    ring = [comm.ring_bytes("all_reduce", s, 4) for s in sizes]
    fit = fit_alpha_beta(ring, [float(truth.predict(b)) for b in ring])
    assert fit.alpha_s == pytest.approx(truth.alpha_s, rel=1e-9)
    assert fit.bandwidth_bytes_per_s == pytest.approx(truth.bandwidth_bytes_per_s, rel=1e-9)


def test_fit_needs_two_sizes():
    with pytest.raises(ValueError, match="two different sizes"):
        fit_alpha_beta([1024.0, 1024.0], [1e-3, 2e-3])


def test_time_all_reduce_on_two_ranks():
    sizes = [1024, 65536]
    per_rank = minidist.launch(time_all_reduce, 2, sizes, 2)
    for times in per_rank:
        assert len(times) == len(sizes)
        assert all(t > 0 for t in times)
