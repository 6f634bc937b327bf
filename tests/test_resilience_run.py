"""Lesson 18's run that dies and resumes: torchrun `--max-restarts` restarts a world whose
rank was SIGKILLed, the run resumes from the last complete checkpoint, loses at most one
save interval and ends with the parameters of a run that never stopped, bit for bit."""

import json
import os
import sys
from pathlib import Path

import pytest
from session import run_session

import minidist
from minidist.resilience.run import main, parse, train_on_rank

ROOT = Path(__file__).resolve().parents[1]
STEPS, EVERY, DIE_AT = 6, 2, 3  # saves after steps 2, 4, 6; rank 1 dies after step 3


@pytest.fixture(scope="module")
def uninterrupted():
    return minidist.launch(train_on_rank, 2, parse(["--steps", str(STEPS)]))[0]


def run_args(tmp_path: Path) -> list[str]:
    ck = str(tmp_path / "ck")
    return ["--steps", str(STEPS), "--save", ck, "--save-every", str(EVERY), "--resume", ck,
            "--log-jsonl", str(tmp_path / "log.jsonl"), "--die-at", str(DIE_AT),
            "--die-rank", "1", "--die-once", str(tmp_path / "died")]  # fmt: skip


def lines(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_torchrun_restarts_a_killed_rank_and_the_run_ends_as_if_it_never_stopped(
    tmp_path, uninterrupted
):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
           "--nproc-per-node", "2", "--max-restarts", "3", "--monitor-interval", "0.5",
           "-m", "minidist.resilience.run",
           *run_args(tmp_path)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = run_session(cmd, 600, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    out = lines(done.stdout)
    assert (tmp_path / "died").exists()  # rank 1 did die
    assert out["resumed_from"] == str(DIE_AT - DIE_AT % EVERY)  # the last complete save
    assert out["step"] == str(STEPS)
    assert out["loss"] == repr(uninterrupted["loss"])
    assert out["params_sha256"] == uninterrupted["params_sha256"]
    steps = [json.loads(line)["step"] for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    restart = next(i for i in range(1, len(steps)) if steps[i] <= steps[i - 1])
    lost = steps[restart - 1] - int(out["resumed_from"])  # steps done twice
    assert 0 < lost <= EVERY
    assert steps[restart:] == list(range(int(out["resumed_from"]) + 1, STEPS + 1))


def test_under_launch_the_dead_rank_is_named_and_the_checkpoint_resumes(
    tmp_path, uninterrupted, capsys
):
    args = parse(run_args(tmp_path))
    with pytest.raises(minidist.RankFailedError, match=r"rank 1"):
        minidist.launch(train_on_rank, 2, args)
    assert not (tmp_path / ".ck.unfinished").exists()  # no save was under way
    assert main(run_args(tmp_path)) == 0  # the same command again: resumes
    out = lines(capsys.readouterr().out)
    assert out["resumed_from"] == str(DIE_AT - DIE_AT % EVERY)
    assert out["params_sha256"] == uninterrupted["params_sha256"]


def test_a_zero1_run_resumes_as_if_it_never_stopped(tmp_path, capsys):
    """ZeRO-1 keeps whole parameters on every rank and shards only the optimizer: a resume
    loads the shards and must gather the parameters from them again."""
    zero1 = ["--wrapper", "zero1"]
    never_stopped = minidist.launch(train_on_rank, 2, parse(["--steps", str(STEPS), *zero1]))[0]
    args = run_args(tmp_path) + zero1
    with pytest.raises(minidist.RankFailedError, match=r"rank 1"):
        minidist.launch(train_on_rank, 2, parse(args))
    assert main(args) == 0
    out = lines(capsys.readouterr().out)
    assert out["resumed_from"] == str(DIE_AT - DIE_AT % EVERY)
    assert out["loss"] == repr(never_stopped["loss"])
    assert out["params_sha256"] == never_stopped["params_sha256"]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--steps", "0"], "--steps=0 must be >= 1"),
        (["--save-every", "2"], "--save-every needs --save DIR"),
    ],
)
def test_bad_arguments_are_named(argv, words, capsys):
    with pytest.raises(SystemExit):
        parse(argv)
    assert words in capsys.readouterr().err
