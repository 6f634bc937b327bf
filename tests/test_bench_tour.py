"""The bench harness and the tour run end to end (no speed is asserted here, ever)."""

import subprocess
import sys

import pytest

from minidist.bench import ABResult, interleaved_ab
from minidist.registry import TourRow, tour_rows
from minidist.tour import format_table

ROWS = tour_rows()


def test_ab_ratio_is_the_median_of_per_round_ratios():
    assert ABResult([1.0, 2.0, 9.0], [1.0, 1.0, 1.0]).ratio == 2.0


def test_interleaved_ab_alternates_order():
    calls = []
    result = interleaved_ab(
        lambda: calls.append("a"), lambda: calls.append("b"), rounds=2, steps=1, warmup=0
    )
    assert calls == ["a", "b", "b", "a"]
    assert len(result.seconds_a) == len(result.seconds_b) == 2


def test_bench_ddp_prints_name_value_lines():
    out = subprocess.run(
        [sys.executable, "-m", "minidist", "bench", "ddp", "--rounds", "1", "--steps", "1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    values = dict(line.split("=") for line in out.stdout.split())
    assert float(values["ddp_step_ratio_vs_torch"]) > 0
    assert 0 <= float(values["ddp_overlap"]) <= 1


def test_unknown_bench_is_named():
    out = subprocess.run(
        [sys.executable, "-m", "minidist", "bench", "nope"], capture_output=True, text=True
    )
    assert out.returncode != 0 and "nope" in out.stderr


@pytest.mark.parametrize("name", list(ROWS))
def test_tour_row_matches_reference_and_theory(name, run_tour_row):
    row = run_tour_row(name)
    assert row.matches, row
    if row.bytes_theory is not None:
        assert row.bytes_per_rank == pytest.approx(row.bytes_theory)
    if row.memory_theory is not None:
        assert row.memory_per_rank == row.memory_theory
    assert "yes" in format_table([row])


def test_every_lesson_registers_a_row_in_lesson_order():
    assert list(ROWS) == [
        "ring all-reduce", "naive DP", "bucketed DDP", "ZeRO-1", "ZeRO-2",
        "weight-update sharding (Xu et al.)", "FSDP (ZeRO-3)",
        "FSDP hybrid", "FSDP + bf16", "ZeRO-2 + bf16", "FSDP + CPU offload",
        "FSDP + disk offload", "recompute", "FSDP + recompute", "tensor parallel",
        "parallel layout", "pipeline GPipe", "pipeline 1F1B", "3D (TP x PP x DP)",
        "distributed slots (HugeCTR)", "localized slots (HugeCTR)", "Wide&Deep (hash emb. + DDP)",
        "parameter server (BSP)", "2D torus all-reduce", "hierarchical all-reduce", "GeePS cache",
        "planner", "sequence parallel", "context parallel", "expert parallel",
        "expert parallel GPT", "every parallelism at once",
        "universal checkpoint, resumed on another layout",
        "DeepSeek-V3 (dp_shard x ep x pp, bias update)",
    ]  # fmt: skip


def test_tour_table_flags_a_mismatch():
    row = TourRow("x", False, 1.0, None, None, None, None)
    assert "NO" in format_table([row])
