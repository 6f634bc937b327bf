"""The trainer's loop with a dead rank (a callback the test passes in) and asynchronous saves.

A rank SIGKILLed after step 3 (saves every 2 steps): `launch` names it, the previous
checkpoint is whole, and the same command again resumes from step 2's save and ends with the
parameters of a run that never stopped, bit for bit (the same sums in the same order). An
`--async-save` run ends bit for bit as a synchronous one, and logs each save's blocking time.
torchrun's restart of `python -m minidist train` is tests/test_resilience_compose.py's.
"""

import json
from pathlib import Path

import pytest
from worlds import HUNG_S

import minidist
from minidist.trainer.cli import dims_of, kill_rank_after, parse
from minidist.trainer.loop import train_rank

STEPS, EVERY, DIE_AT = 6, 2, 3
LAYOUT = ["--model", "llama", "--dp-shard", "2", "--steps", str(STEPS)]


def _run(argv: list[str], die: bool = False) -> dict:
    args = parse(argv)
    after = kill_rank_after(DIE_AT, 1, None) if die else None
    return train_rank(args, dims_of(args), after_step=after)


def test_a_dead_rank_is_named_and_the_same_command_resumes_bit_for_bit(tmp_path):
    whole = minidist.launch(_run, 2, LAYOUT, timeout_s=600, idle_s=HUNG_S)[0]
    ck = str(tmp_path / "ck")
    argv = [*LAYOUT, "--save", ck, "--save-every", str(EVERY), "--resume", ck]
    with pytest.raises(minidist.RankFailedError, match=r"rank 1"):
        minidist.launch(_run, 2, argv, True, timeout_s=600, idle_s=HUNG_S)
    assert not (tmp_path / ".ck.unfinished").exists()  # no save was under way
    again = minidist.launch(_run, 2, argv, timeout_s=600, idle_s=HUNG_S)[0]
    assert again["resumed_from"] == DIE_AT - DIE_AT % EVERY and again["step"] == STEPS
    assert again["samples"] == list(range(again["resumed_from"], STEPS))
    assert again["params_sha256"] == whole["params_sha256"]


def test_an_async_save_run_equals_a_synchronous_one_and_logs_the_blocking_time(tmp_path):
    runs = {}
    for mode in ("sync", "async"):
        argv = [
            *LAYOUT,
            "--save",
            str(tmp_path / mode),
            "--save-every",
            str(EVERY),
            "--log",
            str(tmp_path / f"{mode}.jsonl"),
        ]
        runs[mode] = minidist.launch(
            _run,
            2,
            argv + (["--async-save"] if mode == "async" else []),
            timeout_s=600,
            idle_s=HUNG_S,
        )[0]
    assert runs["async"]["params_sha256"] == runs["sync"]["params_sha256"]
    log = [json.loads(line) for line in Path(tmp_path / "async.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "save_blocked_s" in r] == [2, 4, 6]
    resumed = minidist.launch(
        _run,
        2,
        [*LAYOUT, "--steps", "7", "--resume", str(tmp_path / "async")],
        timeout_s=600,
        idle_s=HUNG_S,
    )[0]
    assert resumed["resumed_from"] == STEPS  # the last async save was whole
