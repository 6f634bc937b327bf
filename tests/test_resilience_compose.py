"""Lesson 18 on lesson 17's engine: `python -m minidist train --save/--resume`.

Same layout: the resumed run's losses, parameters and Adam states equal the uninterrupted
run's to the last bit (the same sums in the same order; the checkpoint holds the float32
masters and the step count exactly). Another layout: the continuation equals the
one-process run of the same steps within lesson 17's tolerances (tests/test_compose.py:
losses 1e-5, parameters 1e-3: a different reduction order, a few ulps per step that Adam's
1/√v amplifies where a gradient is near 0; bf16: losses 1e-2, tests/test_compose_layouts,
parameters 2·steps·lr = 8e-2, the most two Adam runs of 4 steps can part). Measured: losses
≤ 2.4e-7, parameters ≤ 1.2e-4 (fp32); bf16 losses 2.8e-3, parameters 5.8e-2.
A resume that did not load (fresh weights at step 2) misses the losses by > 0.1.
"""

import hashlib
from pathlib import Path

import pytest
import torch
from session import run_session
from worlds import HUNG_S

import minidist
from minidist.compose.fixture import LR, reference
from minidist.resilience import CheckpointLayoutError
from minidist.trainer.cli import dims_of, parse
from minidist.trainer.loop import train_rank
from minidist.training import max_abs_diff

SAVE_AT, STEPS = 2, 4


def _run(argv: list[str]) -> dict:
    args = parse(argv)
    return train_rank(args, dims_of(args))


def _same_layout(ck: str, layout: list[str]) -> tuple[dict, dict]:
    whole = _run(layout + ["--steps", str(STEPS)])
    _run(layout + ["--steps", str(SAVE_AT), "--save", ck])
    return whole, _run(layout + ["--steps", str(STEPS), "--resume", ck])


SAME_LAYOUTS = [  # 4 ranks each: every kind of parallelism in one of them
    [
        "--model",
        "llama",
        "--dp-shard",
        "2",
        "--pp",
        "2",
        "--schedule",
        "interleaved",
        "--virtual",
        "2",
        "--micro-batch",
        "2",
    ],
    ["--model", "gpt", "--tp", "2", "--sp", "--cp", "2", "--precision", "bf16",
     "--micro-batch", "4"],  # 2 micro-batches (tests/micro_batches.py)
    ["--model", "moe", "--dp-shard", "4", "--ep", "2"],
    ["--model", "gpt", "--dp-shard", "4", "--dp-shard-mode", "optim_grads_params",
     "--optimizer-cpu-offload"],  # the host's chunks saved and loaded
]  # fmt: skip


def _same_layouts(ck: str) -> list[tuple[dict, dict]]:
    return [_same_layout(f"{ck}{i}", layout) for i, layout in enumerate(SAME_LAYOUTS)]


def test_a_resume_on_the_same_layout_is_bit_for_bit(tmp_path):
    runs = minidist.launch(_same_layouts, 4, str(tmp_path / "ck"), timeout_s=600, idle_s=HUNG_S)[0]
    for layout, (whole, resumed) in zip(SAME_LAYOUTS, runs):
        assert resumed["resumed_from"] == SAVE_AT and resumed["step"] == STEPS
        assert resumed["losses"] == whole["losses"][SAVE_AT:], layout  # exactly
        for key in ("params", "optim"):
            assert whole[key].keys() == resumed[key].keys()
            for name, t in whole[key].items():
                assert torch.equal(t, resumed[key][name]), (layout, name)
        assert resumed["params_sha256"] == whole["params_sha256"]


CHANGES = {
    "8 ranks to 4, tp 2 to 1, pp 2 to 1": (
        "gpt",
        ["--dp-shard", "2", "--tp", "2", "--pp", "2"],
        ["--dp-shard", "4"],
    ),
    "pp 2 to 4, the blocks re-staged": ("gpt", ["--dp-shard", "2", "--pp", "2"], ["--pp", "4"]),
    "ep 2 to 4": ("moe", ["--dp-shard", "2", "--ep", "2"], ["--dp-shard", "4", "--ep", "4"]),
    "cp 2 to 1 in bf16": (
        "llama",
        ["--cp", "2", "--tp", "2", "--precision", "bf16", "--micro-batch", "4"],
        ["--dp-shard", "2", "--precision", "bf16", "--micro-batch", "2"],
    ),
    "ZeRO-1 with tp 2 to FSDP with cp 2": (
        "gpt",
        ["--dp-shard", "2", "--tp", "2", "--micro-batch", "2"],
        ["--dp-shard", "2", "--cp", "2", "--dp-shard-mode", "optim_grads_params"],
    ),
    "ZeRO-1 with tp 2 to FSDP offloaded with pp 2": (
        "llama",
        ["--dp-shard", "2", "--tp", "2"],
        [
            "--dp-shard",
            "2",
            "--pp",
            "2",
            "--dp-shard-mode",
            "optim_grads_params",
            "--optimizer-cpu-offload",
        ],
    ),
    "FSDP with ep 2 to ZeRO-2 with pp 2": (
        "moe",
        ["--dp-shard", "4", "--ep", "2", "--dp-shard-mode", "optim_grads_params"],
        ["--dp-shard", "2", "--pp", "2", "--dp-shard-mode", "optim_grads"],
    ),
}


def _world(layout: list[str]) -> int:
    dims = dims_of(parse(layout))
    return minidist.compose.ParallelDims(**dims).world_size


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_resume_on_another_layout_goes_on_as_the_one_process_run(tmp_path, change):
    model, before, after = CHANGES[change]
    ck = str(tmp_path / "ck")
    before = ["--model", model, *before, "--steps", str(SAVE_AT), "--save", ck]
    after = ["--model", model, *after, "--steps", str(STEPS), "--resume", ck]
    saved = minidist.launch(_run, _world(before), before, timeout_s=600, idle_s=HUNG_S)[0]
    resumed = minidist.launch(_run, _world(after), after, timeout_s=600, idle_s=HUNG_S)
    want = reference(model, STEPS)
    loss_tol, param_tol = (1e-2, 2 * STEPS * LR) if "bf16" in change else (1e-5, 1e-3)
    assert resumed[0]["resumed_from"] == SAVE_AT
    assert saved["losses"] == pytest.approx(want["losses"][:SAVE_AT], abs=loss_tol)
    assert resumed[0]["losses"] == pytest.approx(want["losses"][SAVE_AT:], abs=loss_tol)
    assert max_abs_diff(resumed[0]["params"], want["params"]) < param_tol
    if "bf16" not in change:
        assert max_abs_diff(resumed[0]["optim"], want["optim"]) < 1e-5
    # each rank read the rectangles it needed, not the whole state
    whole = sum(p.numel() * 4 * 3 for p in want["params"].values())
    assert all(r["read"][0] < whole for r in resumed) or len(resumed) == 1


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(path.rglob("*")):
        if f.is_file():
            h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def _refused(ck: str) -> str:
    _run(["--layers", "2", "--dp-shard", "2", "--steps", "1", "--save", ck])
    before = _digest(Path(ck))
    try:
        _run(["--dp-shard", "2", "--steps", "2", "--resume", ck, "--save", ck])
    except CheckpointLayoutError as e:
        assert _digest(Path(ck)) == before  # nothing changed on disk
        return str(e)
    return "not refused"


def test_a_checkpoint_of_another_depth_is_refused_naming_both_layouts(tmp_path):
    message = minidist.launch(_refused, 2, str(tmp_path / "ck"), timeout_s=600, idle_s=HUNG_S)[0]
    assert "'layers': 2" in message and "'layers': 4" in message, message
    assert "saved with model" in message and "this run has model" in message, message


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--save-every", "2"], "--save-every=2 needs --save"),
        (["--steps", "0"], "--steps=0 must be >= 1"),
        (["--eval-every", "-1"], "--eval-every=-1 must be >= 0"),
        (["--dp-shard", "2", "--die-at", "1", "--die-rank", "2"], "--die-rank=2 must be a rank"),
        (["--dp-shard", "2", "--ep", "3"], "ep=3 must divide dp_shard"),
    ],
)
def test_bad_options_are_refused_before_any_world(argv, words):
    with pytest.raises(ValueError, match=words):
        parse(argv)


def test_torchrun_restarts_a_killed_rank_of_minidist_train_bit_for_bit(tmp_path):
    """`torchrun --max-restarts 3 -m minidist train ... --save D --resume D`, rank 1 SIGKILLed
    after step 3: the restarted world resumes from step 2's save (one interval lost at most)
    and ends with the uninterrupted run's loss and parameters, bit for bit."""
    import json
    import os
    import sys

    layout = ["--model", "llama", "--tp", "2", "--sp", "--micro-batch", "4"]
    whole = minidist.launch(
        _run, 2, layout + ["--steps", str(STEPS)], timeout_s=600, idle_s=HUNG_S
    )[0]
    ck, log = str(tmp_path / "ck"), tmp_path / "log.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "3",
        "--monitor-interval",
        "0.5",
        "-m",
        "minidist",
        "train",
        *layout,
        "--steps",
        str(STEPS),
        "--save",
        ck,
        "--save-every",
        str(SAVE_AT),
        "--resume",
        ck,
        "--log-jsonl",
        str(log),
        "--die-at",
        "3",
        "--die-rank",
        "1",
        "--die-once",
        str(tmp_path / "died"),
    ]
    root = Path(__file__).resolve().parents[1]
    # TMPDIR: torchrun's own log folders (torchelastic_*), which it leaves, in tmp_path
    env = {**os.environ, "PYTHONPATH": str(root), "TMPDIR": str(tmp_path)}
    done = run_session(cmd, 600, env=env, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if "=" in line]
    out = dict(line.split("=", 1) for line in lines)
    assert (tmp_path / "died").exists()
    # rank 0 alone prints, once: two ranks' prints interleave ("step=4planned_memory_...")
    assert len(lines) == len(out) and "loss" in out, done.stdout
    # once in about 4 runs of make test (load 5-8) the last attempt resumed from step 4: the
    # restarted world failed after its last save and torchrun restarted it again; its
    # stderr says why
    why = done.stderr[-4000:]
    assert out["resumed_from"] == str(SAVE_AT) and out["step"] == str(STEPS), why
    assert out["loss"] == repr(whole["losses"][-1])
    assert out["params_sha256"] == whole["params_sha256"]
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines()]
    assert steps == [1, 2, 3, 3, 4]  # step 3 done twice: one step lost, under one interval
