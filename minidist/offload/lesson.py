"""Lesson 05's entries in the tour: FSDP with its optimizer offloaded to the host or to disk.

Each row trains lesson 03's FSDP on the course GPT with Adam on the device and again with
an `OffloadOptimizer` (same world, same batches): the two must be bit-identical (the same
fp32 Adam on the same values, only elsewhere), and both equal to single-process Adam within
lesson 03's tolerances (`minidist.zero.fixture.reference`).

What the row's columns mean for offload:
- memory per rank: the model state resident on the compute *device* (FSDP's chunks, their
  gradients, the frozen parameter; no optimizer state, which offload moved away), measured
  per storage, against `theory.tier_bytes(...)["device"]`. The host's and the disk's bytes
  are in the row's figure, measured against the formula.
- bytes per rank per step: the traffic over the device-host *bus*, counted at every copy
  (`OffloadOptimizer.moved`: gradients down, parameters up), against
  `theory.bytes_moved_per_step`. The network's collectives are FSDP's own, unchanged by
  offload (the FSDP row and tests/test_offload.py check them); the comparison contract's
  gathers never touch the bus.
"""

from __future__ import annotations

from pathlib import Path

from ..data_parallel.fixture import build
from ..fsdp.lesson import GRAD_TOL, PARAM_TOL
from ..registry import TourRow, tour_row
from ..runtime import launch
from ..training import max_abs_diff
from ..zero.fixture import reference
from . import theory
from .fixture import train_on_rank

MODEL = "gpt"
LABELS = {"device": "on the device", "cpu": "CPU offload", "disk": "disk offload"}
ROWS = {"cpu": "FSDP + CPU offload", "disk": "FSDP + disk offload"}


def frozen_elements(name: str = MODEL) -> int:
    return sum(p.numel() for p in build(name).model.parameters() if not p.requires_grad)


def formula(info: dict, placement: str) -> dict[str, dict[str, int]]:
    """`theory.tier_bytes` for the rank `info` (from `train_on_rank`) describes."""
    return theory.tier_bytes(info["owned"], placement, info["tensors"], frozen_elements())


def _offload_row(tier: str, world_size: int, out_dir: Path) -> TourRow:
    import matplotlib.pyplot as plt

    from .plots import plot_tiers

    ref = reference(MODEL)
    on_device = launch(train_on_rank, world_size, None)
    offloaded = launch(train_on_rank, world_size, tier)
    identical = all(
        max_abs_diff(t.params, d.params) == 0.0 and t.losses == d.losses
        for (t, _), (d, _) in zip(offloaded, on_device)
    )
    diff = max(max_abs_diff(t.params, ref.params) for t, _ in offloaded)
    grad_diff = max(max_abs_diff(t.grads, ref.grads) for t, _ in offloaded)
    (_, info), (_, device_info) = offloaded[0], on_device[0]
    expected = formula(info, tier)
    measured = {LABELS["device"]: device_info["tiers"], LABELS[tier]: info["tiers"]}
    formulas = {LABELS["device"]: formula(device_info, "device"), LABELS[tier]: expected}
    title = f"{ROWS[tier]}, GPT, rank 0 of {world_size}: measured vs formula"
    fig = plot_tiers(measured, formulas, title)
    fig.savefig(out_dir / f"offload_{tier}_tiers.png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return TourRow(
        ROWS[tier],
        identical and diff < PARAM_TOL and grad_diff < GRAD_TOL,
        diff,
        memory_per_rank=sum(info["tiers"]["device"].values()),
        memory_theory=sum(expected["device"].values()),
        bytes_per_rank=sum(info["moved_per_step"].values()),
        bytes_theory=sum(theory.bytes_moved_per_step(info["owned"]).values()),
    )


@tour_row("FSDP + CPU offload", lesson=5)
def cpu_offload_row(world_size: int, out_dir: Path) -> TourRow:
    return _offload_row("cpu", world_size, out_dir)


@tour_row("FSDP + disk offload", lesson=5)
def disk_offload_row(world_size: int, out_dir: Path) -> TourRow:
    return _offload_row("disk", world_size, out_dir)
