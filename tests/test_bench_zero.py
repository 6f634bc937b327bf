"""The `zero` bench runs end to end and prints `name=value` lines (no speed asserted, ever)."""

import subprocess
import sys

import minidist.fsdp.bench  # noqa: F401  (the bench module itself must import cleanly)
from minidist.registry import benches


def test_zero_bench_is_registered_by_the_fsdp_lesson():
    assert "zero" in benches()  # found through minidist.fsdp.lesson, which imports bench.py


def test_bench_zero_prints_name_value_lines():
    out = subprocess.run(
        [sys.executable, "-m", "minidist", "bench", "zero", "--rounds", "1", "--steps", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert all("=" in line for line in lines), out.stdout
    values = dict(line.split("=", 1) for line in lines)
    assert int(values["world_size"]) == 2
    for pair in ("fsdp", "zero1"):
        assert float(values[f"{pair}_step_ms_minidist"]) > 0
        if values.get(f"{pair}_torch_baseline") == "unavailable":
            assert values[f"{pair}_torch_error"]  # the reason is printed, on one line
            continue
        assert float(values[f"{pair}_step_ratio_vs_torch"]) > 0
        assert float(values[f"{pair}_step_ms_torch"]) > 0
        # The two sides must compute the same thing, or the ratio means nothing.
        assert values[f"{pair}_same_loss"] == "True", out.stdout
