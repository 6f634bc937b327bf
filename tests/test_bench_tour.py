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
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    values = dict(line.split("=") for line in out.stdout.split())
    assert float(values["ddp_step_ratio_vs_torch"]) > 0
    assert 0 <= float(values["ddp_overlap"]) <= 1


def test_unknown_bench_is_named():
    out = subprocess.run(
        [sys.executable, "-m", "minidist", "bench", "nope"], capture_output=True, text=True
    )
    assert out.returncode == 2 and "unknown bench 'nope'" in out.stderr.splitlines()[-1]
    assert out.stdout == "" and "Traceback" not in out.stderr


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
        "ring all-reduce",
        "naive DP",
        "bucketed DDP",
        "ZeRO-1",
        "ZeRO-2",
        "weight-update sharding (Xu et al.)",
        "FSDP (ZeRO-3)",
        "FSDP hybrid",
        "FSDP + bf16",
        "ZeRO-2 + bf16",
        "FSDP + CPU offload",
        "FSDP + disk offload",
        "recompute",
        "FSDP + recompute",
        "tensor parallel",
        "parallel layout",
        "pipeline GPipe",
        "pipeline 1F1B",
        "3D (TP x PP x DP)",
        "distributed slots (HugeCTR)",
        "localized slots (HugeCTR)",
        "Wide&Deep (hash emb. + DDP)",
        "parameter server (BSP)",
        "2D torus all-reduce",
        "hierarchical all-reduce",
        "GeePS cache",
        "planner",
        "sequence parallel",
        "context parallel",
        "expert parallel",
        "expert parallel GPT",
        "every parallelism at once",
        "universal checkpoint, resumed on another layout",
        "DeepSeek-V3 (dp_shard x ep x pp, bias update)",
    ]


def test_tour_table_flags_a_mismatch():
    row = TourRow("x", False, 1.0, None, None, None, None)
    assert "NO" in format_table([row])


def test_bench_compose_takes_the_model_sizes_and_reports_the_one_process_step_and_mfu():
    argv = [
        "bench",
        "compose",
        "--world-size",
        "2",
        "--rounds",
        "1",
        "--steps",
        "1",
        "--hidden",
        "48",
        "--seq-len",
        "12",
        "--layers",
        "3",
    ]
    out = subprocess.run(
        [sys.executable, "-m", "minidist", *argv], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    values = dict(line.split("=") for line in out.stdout.split())
    # 3 layers of hidden 48, ffn 96, 4 heads of 12 with 2 K/V heads: the sizes were used
    from minidist.compose.fixture import build

    model, _ = build("llama", steps=1, hidden=48, seq_len=12, layers=3)
    assert int(values["params"]) == sum(p.numel() for p in model.parameters())
    assert int(values["tokens_per_step"]) == 8 * 12
    step, alone = float(values["compose_step_s"]), float(values["one_process_step_s"])
    assert float(values["vs_one_process"]) == pytest.approx(step / alone, rel=1e-3)
    flops = 6 * int(values["params"]) * 8 * 12
    mfu = flops / step / float(values["peak_flops"])
    assert float(values["compose_mfu"]) == pytest.approx(mfu, rel=1e-3)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["compose", "--hidden", "50"], "--hidden 50 must be a multiple of 8"),
        (["compose", "--world-size", "2", "--seq-len", "7"], "--seq-len 7 must divide by tp=2"),
        (["compose", "--world-size", "8", "--layers", "3"], "--layers 3 must divide by pp=2"),
        (["compose", "--world-size", "3"], "--world-size 3 must be 2, 4 or 8"),
        (["ddp", "--layers", "3"], "argument --layers: bench ddp has no model size to set"),
        (["compose", "--hidden", "0"], "argument --hidden"),
    ],
)
def test_bench_sizes_a_bench_cannot_take_are_one_line_exit_2_before_any_rank(
    argv, words, capsys, monkeypatch
):
    """In this process (a subprocess per case cost 3.5 core-s, most of it torch's import;
    test_unknown_bench_is_named runs the real command line): the parser's exit 2, one line,
    and no world launched."""
    import multiprocessing.process

    from minidist.__main__ import main

    def no_rank(process):
        raise AssertionError("a rank was started")

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", no_rank)
    with pytest.raises(SystemExit) as exit_:
        main(["bench", *argv])
    out = capsys.readouterr()
    assert exit_.value.code == 2 and words in out.err.splitlines()[-1], out.err[-2000:]
    assert out.out == "" and "Traceback" not in out.err


def test_peak_flops_counts_the_cores_ranks_share_not_the_ranks(monkeypatch):
    from minidist.bench import matmul_flops, peak_flops

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert peak_flops(10.0, 1, threads=1) == 10.0  # one rank, one thread: one core
    assert peak_flops(10.0, 4, threads=1) == 20.0  # four ranks on two cores: two cores
    assert peak_flops(20.0, 1, threads=2) == 20.0  # one rank on both cores
    assert peak_flops(20.0, 2, threads=2) == 20.0  # two ranks of two threads: still two
    assert peak_flops(10.0, 8, threads=1, on_gpu=True) == 80.0  # a GPU each
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun: 4 machines of 2 ranks
    assert peak_flops(10.0, 8, threads=1) == 80.0
    assert 0 < matmul_flops(16, 8, 4) < float("inf")
