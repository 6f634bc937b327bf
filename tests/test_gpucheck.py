"""The GPU check's CPU side: its no-GPU exit, its sections, and its checks run on CPUs."""

import subprocess
import sys

import pytest
import torch

from minidist import gpucheck
from minidist.training import TrainTrace


def test_without_a_gpu_it_says_so_and_exits_0(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    lines = []
    assert gpucheck.main(lines.append) == 0
    assert lines[0] == "gpu=none"
    if not torch.cuda.is_available():
        out = subprocess.run(
            [sys.executable, "-m", "minidist", "gpucheck"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.splitlines()[0] == "gpu=none"


def test_a_section_prints_name_value_lines_and_survives_a_failure():
    lines = []
    assert gpucheck.section("a", lambda: {"x": 0.5, "ok": True}, lines.append)
    assert lines[:2] == ["a_x=0.5", "a_ok=True"] and lines[2].startswith("a_seconds=")
    lines.clear()
    assert not gpucheck.section("b", lambda: 1 / 0, lines.append)
    assert lines[0].startswith("b_error=ZeroDivisionError") and "b_ok=False" in lines


def test_the_trace_is_found_in_every_fixture_result_shape():
    p = {"w": torch.ones(2)}
    trace = TrainTrace([1.0, 0.5], {}, p)
    for result in (trace, (trace, None), {"trace": trace}, {"losses": [1.0, 0.5], "params": [p]}):
        losses, params = gpucheck._trace_of(result)
        assert losses == [1.0, 0.5] and params is p
    with pytest.raises(TypeError, match="no training trace"):
        gpucheck._trace_of(3)
    from minidist.expert_parallel.fixture import EPRun, Step

    steps = [Step(torch.full((2, 1), v, device="cpu"), None, None, None, {}) for v in (1.0, 3.0)]
    losses, params = gpucheck._trace_of(EPRun(steps, p, [], [], 0, 0))
    assert losses == [1.0, 9.0] and params is p  # each step's mean square output


def test_lessons_14_to_16_are_in_the_nccl_tour_and_the_world_of_one_checks():
    """The NCCL tour runs every registered row: lessons 14-16's among them; and every
    wrapper of the world-of-one checks names a rank function that exists."""
    import importlib

    from minidist import registry

    registry.tour_rows()
    lessons = {lesson for lesson, _ in registry._TOUR_ROWS.values()}
    assert {14, 15, 16} <= lessons
    for name, module, fn, _, _ in gpucheck.WRAPPERS:
        assert callable(getattr(importlib.import_module(module), fn)), name
    assert {"sequence_parallel", "context_parallel", "expert_parallel"} <= {
        c[0] for c in gpucheck.WRAPPERS
    }


def test_triton_against_torch_runs_on_the_interpreter():
    """The same comparison as on a GPU, on few keys under TRITON_INTERPRET."""
    figures = gpucheck.triton_vs_torch(n=512, dim=4, device="cpu")
    assert figures == {
        "keys": 512,
        "same_keys_found": True,
        "same_vectors": True,
        "same_bags": True,
        "same_grads": True,
        "ok": True,
    }


CHEAP = (
    "bucketed_ddp",
    "pipeline_1f1b",
    "sequence_parallel",
    "context_parallel",
    "expert_parallel",
    "composed_llama",
)


@pytest.mark.parametrize("case", [c for c in gpucheck.WRAPPERS if c[0] in CHEAP], ids=str)
def test_a_wrapper_in_a_world_of_one_against_itself_on_cpus(case):
    figures = gpucheck.wrapper_in_world_of_one(case, "cpu")
    assert figures == {"loss_diff": 0.0, "param_diff": 0.0, "ok": True}


def test_tour_rows_reports_each_row_and_survives_a_broken_one(monkeypatch):
    from minidist import registry
    from minidist.runtime import cuda_memory

    def good(world, folder):
        cuda_memory.record([123, 9])  # what two NCCL worlds of the row would record
        cuda_memory.record([77, 1000])
        return registry.TourRow("good", True, 1e-7, 100, 100, 8.0, 8.0)

    def off_theory(world, folder):
        return registry.TourRow("off", True, 0.0, 120, 100, None, None)

    def broken(world, folder):
        raise ValueError(f"world_size={world} must be >= 8")

    rows = {"Good row": good, "off theory": off_theory, "3D (t x p)": broken}
    monkeypatch.setattr(registry, "tour_rows", lambda: rows)
    out = gpucheck.tour_rows(2)
    assert out["good_row"] == "yes/1.0e-07" and out["good_row_memory"] == "100/100"
    assert out["good_row_max_memory_allocated_rank0"] == 123  # rank 0, its largest world
    keys = list(out)
    assert keys.index("good_row_max_memory_allocated_rank0") == keys.index("good_row_memory") + 1
    assert out["off_theory_memory"] == "120/100"
    assert not any(k.startswith("off_theory_max_memory") for k in out)  # no NCCL world
    assert out["3d__t_x_p"] == "error: ValueError: world_size=2 must be >= 8"
    assert out["ok"] is False
    del rows["off theory"], rows["3D (t x p)"]
    assert gpucheck.tour_rows(2)["ok"] is True
