"""Lesson 18's theory: Young's and Daly's intervals minimise the losses they model, Daly's
expected wall time is what a simulated run with Poisson failures takes, Llama 3's figures."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.resilience import theory


def argmin(f, lo, hi, steps=1500):
    """The minimiser of `f` on a geometric grid of [lo, hi]."""
    grid = [lo * (hi / lo) ** (i / steps) for i in range(steps + 1)]
    return min(grid, key=f)


@settings(max_examples=25, deadline=None)
@given(st.floats(1.0, 600.0), st.floats(3_600.0, 1e6))
def test_young_minimises_the_first_order_loss(save, mtbf):
    """No interval of a fine grid loses less, and a step either side loses more (comparing the
    arguments instead fails where the minimum is flat: a grid point's rounding moves it)."""

    def lost(t):
        return theory.fraction_lost_first_order(t, save, mtbf)

    young = theory.young_interval(save, mtbf)
    best = argmin(lost, save / 10, 10 * mtbf)
    assert lost(young) <= lost(best) * (1 + 1e-12)
    assert lost(young) < lost(young * 1.01) and lost(young) < lost(young / 1.01)


@settings(max_examples=25, deadline=None)
@given(st.floats(1.0, 3_000.0), st.floats(600.0, 1e6))
def test_daly_is_near_the_minimum_of_the_exponential_model(save, mtbf):
    def lost(t):
        return theory.fraction_lost(t, save, mtbf)

    best = argmin(lost, save / 100, 20 * mtbf)
    daly, young = theory.daly_interval(save, mtbf), theory.young_interval(save, mtbf)
    assert lost(daly) <= lost(best) * (1 + 1e-3) + 1e-9
    assert lost(daly) <= lost(young) + 1e-12  # the higher order never does worse here


def test_daly_tends_to_young_when_saves_are_short_and_is_m_when_long():
    assert theory.daly_interval(1.0, 1e7) == pytest.approx(theory.young_interval(1.0, 1e7), 1e-3)
    assert theory.daly_interval(500.0, 200.0) == 200.0


def test_expected_wall_time_is_what_a_run_with_poisson_failures_takes():
    rng = random.Random(0)
    work, interval, save, mtbf = 50_000.0, 900.0, 60.0, 3_000.0
    runs = []
    for _ in range(400):
        elapsed, done = 0.0, 0.0
        while done < work:
            failure = rng.expovariate(1 / mtbf)
            if failure >= interval + save:  # the segment and its save complete
                elapsed, done = elapsed + interval + save, done + interval
            else:  # everything since the last save is lost
                elapsed += failure
        runs.append(elapsed)
    simulated = sum(runs) / len(runs)
    # 400 runs of ~56 segments: the mean's standard error is well under 1%
    assert simulated == pytest.approx(theory.expected_wall_time(work, interval, save, mtbf), 0.02)


def test_llama3_figures():
    m = theory.llama3_mtbf()
    assert m == pytest.approx(54 * 86_400 / 466) and 2.7 < m / 3600 < 2.9
    tau = theory.young_interval(60.0, m)  # a 60 s blocking save
    assert tau == pytest.approx(math.sqrt(2 * 60 * m))
    assert 0.09 < theory.fraction_lost_first_order(tau, 60.0, m) < 0.12
    # a save that blocks for 5 s (asynchronous) loses about 3.5x less
    short = theory.young_interval(5.0, m)
    assert theory.fraction_lost(short, 5.0, m) < theory.fraction_lost(tau, 60.0, m) / 3


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), "60"])
def test_bad_input_names_the_argument(bad):
    with pytest.raises(ValueError, match="save_s="):
        theory.young_interval(bad, 1000.0)
    with pytest.raises(ValueError, match="mtbf_s="):
        theory.daly_interval(10.0, bad)
