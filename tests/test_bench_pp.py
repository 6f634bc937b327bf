"""The `pp` bench runs end to end and prints name=value lines (no speed is asserted, ever)."""

import subprocess
import sys


def test_bench_pp_prints_name_value_lines():
    out = subprocess.run(
        [sys.executable, "-m", "minidist", "bench", "pp", "--rounds", "1", "--steps", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.split("\n")
    values = dict(line.split("=", 1) for line in lines if line)
    assert 0 <= float(values["pp_bubble_measured"]) <= 1
    assert float(values["pp_bubble_theory"]) == 1 / 5  # p = 2, m = 4: (p-1)/(m+p-1)
    if values.get("pp_torch_baseline") == "unavailable":
        assert values["pp_torch_error"]
        assert float(values["pp_step_ms_minidist"]) > 0
    else:
        assert float(values["pp_step_ratio_vs_torch"]) > 0
        assert float(values["pp_step_ms_minidist"]) > 0 and float(values["pp_step_ms_torch"]) > 0
        assert values["pp_same_loss"] in ("True", "False")
