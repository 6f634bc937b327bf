"""How often to save: Young's and Daly's intervals, and the fraction of time a run loses.

A run that saves every τ seconds of work, a save blocking it for δ seconds, failing at a
mean time between failures M (failures a Poisson process: exponential gaps), loses per
failure the work since the last save (τ/2 on average), the saves themselves, and a restart
R. Young 1974 ("A first order approximation to the optimum checkpoint interval", CACM
17(9)) minimises the first-order loss δ/τ + τ/(2M): τ = √(2δM). Daly 2006 ("A higher order
estimate of the optimum checkpoint interval for restart dumps", Future Generation Computer
Systems 22(3), sections 3-4) takes the exponential model whole: the expected wall time for
T_s seconds of work is

    T_w = M · e^{R/M} · (e^{(τ+δ)/M} - 1) · T_s / τ,

minimised near τ = √(2δM)·(1 + ⅓·√(δ/2M) + (1/9)·(δ/2M)) - δ for δ < 2M (else τ = M).

Llama 3 (Dubey et al. 2024, section 3.3.4): 466 job interruptions in 54 days of training on
16,384 GPUs, 419 of them unexpected: a job's M of about 2.8 hours.
"""

from __future__ import annotations

import math

LLAMA3_DAYS, LLAMA3_INTERRUPTIONS, LLAMA3_UNEXPECTED, LLAMA3_GPUS = 54, 466, 419, 16_384


def _check(**values: float) -> None:
    for name, v in values.items():
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"{name}={v!r} must be a finite number of seconds > 0")


def mtbf(days: float, interruptions: int) -> float:
    """Mean time between interruptions, in seconds, of a job interrupted so often."""
    _check(days=days, interruptions=interruptions)
    return days * 86_400 / interruptions


def llama3_mtbf() -> float:
    """The Llama 3 405B job's mean time between interruptions (about 10,000 s, 2.8 h)."""
    return mtbf(LLAMA3_DAYS, LLAMA3_INTERRUPTIONS)


def young_interval(save_s: float, mtbf_s: float) -> float:
    """Young's optimal work between saves: √(2·δ·M)."""
    _check(save_s=save_s, mtbf_s=mtbf_s)
    return math.sqrt(2 * save_s * mtbf_s)


def daly_interval(save_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum: Young's with the next two terms, minus δ (M if δ ≥ 2M)."""
    _check(save_s=save_s, mtbf_s=mtbf_s)
    if save_s >= 2 * mtbf_s:
        return mtbf_s
    x = save_s / (2 * mtbf_s)
    return math.sqrt(2 * save_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - save_s


def expected_wall_time(
    work_s: float, interval_s: float, save_s: float, mtbf_s: float, restart_s: float = 0.0
) -> float:
    """Daly's expected wall time of `work_s` of work, saving after every `interval_s`."""
    _check(work_s=work_s, interval_s=interval_s, save_s=save_s, mtbf_s=mtbf_s)
    if restart_s < 0:
        raise ValueError(f"restart_s={restart_s!r} must be >= 0")
    per_segment = mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1((interval_s + save_s) / mtbf_s)
    return per_segment * work_s / interval_s


def fraction_lost(interval_s: float, save_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """The expected fraction of wall time not spent on useful work (saves, lost work,
    restarts), 1 - T_s / T_w in Daly's model."""
    return 1 - 1 / expected_wall_time(1.0, interval_s, save_s, mtbf_s, restart_s)


def fraction_lost_first_order(interval_s: float, save_s: float, mtbf_s: float) -> float:
    """Young's first-order loss: δ/τ for the saves plus τ/(2M) of work redone."""
    _check(interval_s=interval_s, save_s=save_s, mtbf_s=mtbf_s)
    return save_s / interval_s + interval_s / (2 * mtbf_s)
