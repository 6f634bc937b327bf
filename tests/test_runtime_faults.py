"""launch under repeated interrupts, nested launches, a rank that destroys its own group, and
the runtime's bookkeeping (root cause, torchrun's timeout, who a timeout names) (issue 27)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

import minidist
from minidist.runtime import collect, torchrun
from minidist.runtime.collect import RankFailedError, WorldTimeoutError


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def nested():
    return minidist.launch(lambda: 1, 2)


def test_a_launch_inside_a_rank_is_refused_in_minidist_words():
    with pytest.raises(RankFailedError, match="launch: called inside a rank"):
        minidist.launch(nested, 2, timeout_s=60)


def destroy_at_the_end():
    rank = dist.get_rank()
    dist.barrier()
    dist.destroy_process_group()
    return rank


def test_a_rank_function_that_destroys_its_process_group_is_accepted_quietly(tmp_path):
    """One rank body run to its end (no parent terminating it early): its result is "ok" and
    it writes nothing to stderr, where the second destroy's AssertionError would go."""
    import multiprocessing as mp

    import cloudpickle

    from minidist.runtime import board, rank

    board.create_board(str(tmp_path / "board"), 1)
    cfg = {
        "store_path": str(tmp_path / "store"),
        "board_path": str(tmp_path / "board"),
        "parent_pid": os.getpid(),
        "backend": "gloo",
        "timeout_s": 60.0,
        "threads": 1,
        "cuda_peak": False,
    }
    ctx = mp.get_context("fork")
    recv_end, send_end = ctx.Pipe(duplex=False)
    err_recv, err_send = ctx.Pipe(duplex=False)
    body = ((destroy_at_the_end, (), {}), 0, 1, cfg, send_end, err_send)
    proc = ctx.Process(target=rank._rank_main, args=body)
    proc.start()
    send_end.close()
    err_send.close()
    status, value, _, _ = cloudpickle.loads(recv_end.recv_bytes())
    proc.join(60)
    err = b""
    while chunk := os.read(err_recv.fileno(), 65536):
        err += chunk
    assert (status, value, proc.exitcode) == ("ok", 0, 0)
    assert b"Process group cannot be None" not in err and b"Traceback" not in err, err


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=2, max_size=8, unique=True))
def test_the_root_cause_is_the_first_failure_of_ranks_failing_on_their_own(stamps):
    failures = {r: (t, f"ValueError: rank {r}'s own bug") for r, t in enumerate(stamps)}
    first = min(failures, key=lambda r: failures[r][0])
    assert collect._root_cause(failures).rank == first


@settings(max_examples=30, deadline=None)
@given(st.floats(0.5, 1e5, allow_nan=False))
def test_timeout_s_reaches_init_process_group_under_torchrun(timeout_s):
    seen = {}
    mp = pytest.MonkeyPatch()
    try:
        for key, value in (
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "x"),
            ("MASTER_PORT", "1"),
            ("LOCAL_WORLD_SIZE", "1"),
        ):
            mp.setenv(key, value)
        mp.setattr(torchrun.dist, "is_initialized", lambda: False)
        mp.setattr(torchrun.dist, "init_process_group", lambda *a, **k: seen.update(k))
        mp.setattr(torchrun.dist, "all_gather_object", lambda out, x: out.__setitem__(0, x))
        # the attempt's store (a real TCPStore would wait for the launcher's): its timeout too
        mp.setattr(torchrun, "_attempt_store", lambda t: seen.update(store_timeout=t))
        assert minidist.launch(lambda: 7, None, timeout_s=timeout_s) == [7]
    finally:
        mp.undo()
    assert seen["timeout"].total_seconds() == pytest.approx(timeout_s)
    assert seen["store_timeout"] == pytest.approx(timeout_s)


def some_return(returning):
    if dist.get_rank() not in returning:
        time.sleep(600)
    return dist.get_rank()


@pytest.mark.parametrize("returning", [{0}, {1, 2}])
def test_a_timeout_names_only_the_ranks_that_had_not_returned(returning):
    with pytest.raises(WorldTimeoutError) as info:
        minidist.launch(some_return, 3, returning, timeout_s=4)
    assert info.value.ranks == sorted({0, 1, 2} - returning)


@pytest.mark.parametrize("gap_s", [0.01, 0.05])
def test_two_interrupts_kill_ranks_that_trap_sigterm_and_remove_the_folder(tmp_path, gap_s):
    """The second Ctrl-C lands while launch waits for the ranks to stop: it must kill them
    (they ignore SIGTERM) and still remove the world's folder, while the caller lives on."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    done = tmp_path / "done"
    script = tmp_path / "interrupted.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, signal, time, minidist
            # a shell's background job (a sweep under nohup) inherits SIGINT ignored
            signal.signal(signal.SIGINT, signal.default_int_handler)
            def stubborn():
                signal.signal(signal.SIGTERM, lambda *a: None)
                open(os.path.join({str(tmp_path)!r}, f"pid{{os.getpid()}}"), "w").close()
                time.sleep(600)
            try:
                minidist.launch(stubborn, 2, timeout_s=600)
            except KeyboardInterrupt:
                pass
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            open({str(done)!r}, "w").close()
            time.sleep(120)
            """
        )
    )
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, str(script)], env=env)
    try:
        deadline = time.monotonic() + 300  # a loaded machine takes a while to import torch
        while len(list(tmp_path.glob("pid*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = [int(p.name[3:]) for p in tmp_path.glob("pid*")]
        assert len(pids) == 2
        proc.send_signal(signal.SIGINT)
        time.sleep(gap_s)
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 60
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert done.exists(), "the caller did not come back from the interrupted launch"
        assert proc.poll() is None  # the caller lives on (a notebook kernel would)
        assert [pid for pid in pids if _alive(pid)] == []
        assert [p.name for p in tmp.iterdir() if p.name.startswith("minidist-")] == []
    finally:
        proc.kill()
        proc.wait()


def starts_a_sleeper(folder, fail):
    """Each rank starts a process that would outlive the world, and one forks itself."""
    sleeper = subprocess.Popen(["sleep", "120"])
    pids = [sleeper.pid]
    if dist.get_rank() == 0:
        child = os.fork()
        if child == 0:
            time.sleep(120)
            os._exit(0)
        pids.append(child)
    with open(os.path.join(folder, f"rank{dist.get_rank()}"), "w") as f:
        f.write(" ".join(map(str, pids)))
    if fail and dist.get_rank() == 1:
        raise ValueError("rank 1 fails")
    return len(pids)


@pytest.mark.parametrize("fail", [False, True])
def test_no_process_a_rank_started_outlives_the_world(tmp_path, fail):
    """A subprocess a rank started, or a fork of it, died only when it chose to: it outlived
    launch and the caller. Each rank is a process group of its own, killed at the end."""
    if fail:
        with pytest.raises(RankFailedError, match="rank 1 fails"):
            minidist.launch(starts_a_sleeper, 2, str(tmp_path), fail, timeout_s=60)
    else:
        assert minidist.launch(starts_a_sleeper, 2, str(tmp_path), fail, timeout_s=60) == [2, 1]
    pids = [int(p) for f in tmp_path.glob("rank*") for p in f.read_text().split()]
    assert len(pids) == 3
    deadline = time.monotonic() + 5  # init reaps the killed orphans
    while [p for p in pids if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if _alive(p)] == []
