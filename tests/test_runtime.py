"""launch: results in rank order, fast failure with the rank's traceback, timeouts, no orphans."""

import contextlib
import faulthandler
import importlib
import multiprocessing
import os
import resource
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import types

import pytest
import torch
import torch.distributed as dist

import minidist
from minidist import comm
from minidist.runtime import default_backend


def live_children() -> list[int]:
    """PIDs of this process's running children (zombies and multiprocessing's long-lived
    resource tracker, which spawn starts once per parent, excluded)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if b"resource_tracker" not in f.read():
                    pids.append(int(entry))
    return pids


def rank_and_size():
    return dist.get_rank(), dist.get_world_size(), os.getpid()


@pytest.mark.parametrize("world", [1, 2, 4])
def test_results_in_rank_order(world):
    results = minidist.launch(rank_and_size, world)
    assert [r[:2] for r in results] == [(r, world) for r in range(world)]
    assert len({r[2] for r in results}) == world  # real, distinct processes
    assert live_children() == []


def fail_on_rank(bad_rank):
    if dist.get_rank() == bad_rank:
        raise ValueError(f"deliberate failure on rank {bad_rank}")
    dist.barrier()  # the others wait for the failed rank in a collective


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_failing_rank_fails_fast_with_its_traceback(start_method):
    t0 = time.monotonic()
    with pytest.raises(minidist.RankFailedError) as info:
        minidist.launch(fail_on_rank, 4, 2, start_method=start_method, timeout_s=300)
    # Far below the timeout: spawn's start-up (each rank imports torch) is most of it.
    assert time.monotonic() - t0 < 60
    assert info.value.rank == 2
    assert "deliberate failure on rank 2" in str(info.value)
    assert "fail_on_rank" in str(info.value)  # the traceback names the function
    assert live_children() == []


def hang_on_rank_one():
    if dist.get_rank() == 1:
        time.sleep(600)
    dist.barrier()


def test_hanging_rank_is_stopped_at_timeout_and_named():
    t0 = time.monotonic()
    with pytest.raises(minidist.WorldTimeoutError, match=r"ranks \[0, 1\] still running") as info:
        minidist.launch(hang_on_rank_one, 2, timeout_s=3)
    assert 3 <= time.monotonic() - t0 < 10
    assert info.value.ranks == [0, 1]  # rank 1 sleeps, rank 0 waits for it in the barrier
    assert live_children() == []


def all_reduce_while_rank_one_sleeps():
    if dist.get_rank() == 1:
        time.sleep(600)
    comm.all_reduce(torch.ones(2), tag="stuck")


def spin_on_rank_one():
    if dist.get_rank() == 1:
        while True:
            pass
    dist.barrier()


def test_cpu_limits_stop_a_hang_and_an_endless_loop_long_before_the_clocks():
    """idle_s: no running rank uses the CPU (rank 0 waits in a collective, rank 1 sleeps);
    cpu_s: one rank computes past its budget. Both well before the 120 s of timeout_s (the
    60 s bound below is the generous one, for a machine at load 20)."""
    t0 = time.monotonic()
    with pytest.raises(minidist.WorldTimeoutError, match=r"ranks \[0, 1\] all sat idle") as info:
        minidist.launch(all_reduce_while_rank_one_sleeps, 2, timeout_s=120, idle_s=1)
    assert info.value.why == "idle" and time.monotonic() - t0 < 60
    assert info.value.where[0].startswith("inside all_reduce (tag 'stuck') over 2 ranks")
    t0 = time.monotonic()
    with pytest.raises(minidist.WorldTimeoutError, match=r"rank 1 used cpu_s=1s of CPU") as info:
        minidist.launch(spin_on_rank_one, 2, timeout_s=120, idle_s=1, cpu_s=1)
    assert info.value.why == "cpu" and info.value.spinning == 1 and info.value.ranks == [0, 1]
    assert time.monotonic() - t0 < 60
    assert live_children() == []


def test_without_cpu_times_cpu_s_is_a_limit_by_the_clock(monkeypatch):
    """No /proc and no psutil (say): the world is still stopped, at cpu_s of wall clock."""
    import minidist.runtime.collect as collect

    monkeypatch.setattr(collect, "_cpu_s", lambda pid: None)
    t0 = time.monotonic()
    with pytest.raises(minidist.WorldTimeoutError, match=r"still running after timeout_s=2s"):
        minidist.launch(all_reduce_while_rank_one_sleeps, 2, timeout_s=120, idle_s=1, cpu_s=2)
    assert 2 <= time.monotonic() - t0 < 60


def computes_then_reduces(cpu_seconds):
    start = time.process_time()
    while time.process_time() - start < cpu_seconds:
        pass
    t = torch.ones(2)
    comm.all_reduce(t)
    return float(t[0])


def test_ranks_waiting_for_one_that_computes_are_not_idle():
    """Rank 1 computes 1.5 s, past idle_s=1, while ranks 0 and 2 wait for it inside the
    all-reduce: the world is busy, not hung."""
    got = minidist.launch(_rank_one_computes, 3, timeout_s=120, idle_s=1, cpu_s=10)
    assert got == [3.0, 3.0, 3.0]


def _rank_one_computes():
    return computes_then_reduces(1.5 if dist.get_rank() == 1 else 0.0)


def test_a_rank_finishing_starts_the_idle_window_again(monkeypatch):
    """Ranks 0 and 2 wait while rank 1 computes; rank 1 finishes at t = 1.2 and rank 2 has
    not yet been scheduled to see its last message: not idle (its window starts at the
    finish), until it sits idle_s after it. Before, rank 2's wait for rank 1 counted, and a
    right world on a loaded machine was stopped as hung (make test, load 8)."""
    import minidist.runtime.collect as collect

    clock, cpu = [0.0], {0: 0.0, 1: 0.0, 2: 0.0}
    monkeypatch.setattr(collect.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(collect, "_cpu_s", lambda pid: cpu[pid])
    monkeypatch.setattr(collect, "_waited_s", lambda pid: 0.0)
    procs = [types.SimpleNamespace(pid=r) for r in range(3)]
    watch = collect.CpuLimits(idle_s=1.0)
    for step in range(6):  # rank 1 computes
        clock[0], cpu[1] = 0.2 * step, 0.2 * step
        watch.check(procs, [0, 1, 2], None)
    for t in (1.2, 1.4, 1.8, 2.1):  # ranks 0 and 1 done; rank 2 uses no CPU
        clock[0] = t
        watch.check(procs, [2], None)
    clock[0] = 2.3
    with pytest.raises(minidist.WorldTimeoutError) as info:
        watch.check(procs, [2], None)
    assert info.value.why == "idle" and info.value.ranks == [2]


def test_a_rank_starved_of_cpu_is_not_idle(monkeypatch):
    """Rank 1 is runnable but gets no CPU (a loaded machine: its message arrived, its
    thread waits in the run queue): not idle while it waits, idle once it stops waiting.
    By CPU time alone it was idle, and a right world at load 50 was stopped as hung."""
    import minidist.runtime.collect as collect

    clock, cpu, waited = [0.0], {0: 0.0, 1: 0.0}, {0: 0.0, 1: 0.0}
    monkeypatch.setattr(collect.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(collect, "_cpu_s", lambda pid: cpu[pid])
    monkeypatch.setattr(collect, "_waited_s", lambda pid: waited[pid])
    procs = [types.SimpleNamespace(pid=r) for r in range(2)]
    watch = collect.CpuLimits(idle_s=1.0)
    for step in range(16):  # 3 s: rank 1 waits for a CPU the whole time, rank 0 in a collective
        clock[0], waited[1] = 0.2 * step, 0.19 * step
        watch.check(procs, [0, 1], None)
    for step in range(16, 20):  # rank 1 no longer waits either: a hang idle_s after t = 3
        clock[0] = 0.2 * step
        watch.check(procs, [0, 1], None)
    clock[0] = 4.0
    with pytest.raises(minidist.WorldTimeoutError) as info:
        watch.check(procs, [0, 1], None)
    assert info.value.why == "idle"


def test_a_long_idle_limit_reads_proc_a_twentieth_as_often_and_still_stops_a_hang(monkeypatch):
    """idle_s=60 (the tests' long worlds): /proc is read every 3 s, not every 0.2 s or at
    every wake-up (a rank's stderr, a result): 16 ranks of ~20 threads each were read 5 times
    a second. A hang is still stopped once 60 s have passed, within one read."""
    import minidist.runtime.collect as collect

    assert collect.CpuLimits(idle_s=1.0).poll_s == 0.2
    assert collect.CpuLimits(idle_s=60.0, cpu_s=2.0).poll_s == 0.2  # the shorter limit
    assert collect.CpuLimits(idle_s=60.0).poll_s == 3.0
    clock, reads = [0.0], []
    monkeypatch.setattr(collect.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(collect, "_cpu_s", lambda pid: reads.append(clock[0]) or 0.0)
    monkeypatch.setattr(collect, "_waited_s", lambda pid: 0.0)
    watch = collect.CpuLimits(idle_s=60.0)
    procs = [types.SimpleNamespace(pid=0)]
    with pytest.raises(minidist.WorldTimeoutError) as info:
        for step in range(1000):  # woken every 0.1 s
            clock[0] = 0.1 * step
            watch.check(procs, [0], None)
    assert info.value.why == "idle" and 60.0 <= clock[0] <= 63.0
    assert 20 <= len(reads) <= 42 and min(b - a for a, b in zip(reads, reads[1:])) >= 1.5


def _starved(ready):
    os.nice(5)  # a weight of 335 against the hog's 1024: a quarter of their core at most
    ready.set()
    while True:
        pass


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux's scheduler calls")
def test_run_queue_wait_is_read_for_a_starved_process_and_not_for_a_sleeping_one():
    """A busy loop at nice 5 beside a busy loop at nice 0, both pinned to one core: it waits
    in the run queue at least three quarters of the time (more on a loaded machine). The
    kernel adds a wait to the count when the thread next runs: at nice 19 that was seconds
    apart at load 14, and the count lagged the clock. A sleeping process waits for nothing."""
    import minidist.runtime.collect as collect

    core = sorted(os.sched_getaffinity(0))[:1]
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    starved = ctx.Process(target=_starved, args=(ready,), daemon=True)
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; print(flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE,
    )
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(hog.pid, core)
        starved.start()
        os.sched_setaffinity(starved.pid, core)
        assert ready.wait(30)
        sleeper.stdout.readline()  # asleep: its start-up (runnable, waiting) is over
        cpu0, waited0 = collect._cpu_s(starved.pid), collect._waited_s(starved.pid)
        slept0 = collect._waited_s(sleeper.pid)
        time.sleep(2.0)
        cpu = collect._cpu_s(starved.pid) - cpu0
        waited = collect._waited_s(starved.pid) - waited0
        slept = collect._waited_s(sleeper.pid) - slept0
    finally:
        for p in (hog, sleeper):
            p.kill()
            p.wait()
        starved.kill()
        starved.join()
    assert waited > 1.0 and cpu < waited / 2, (cpu, waited)
    assert slept < 0.05, slept


def test_a_right_world_on_a_loaded_machine_is_not_taken_for_a_hang():
    """Six busy processes per core (load about 7 per core, 14 on this 2-core machine): a
    world whose ranks compute 0.5 s each takes several seconds by the clock, and passes
    limits of 1 s idle and 2 s of CPU time, which a wall limit of 2 s would not."""
    importlib.import_module("torch._dynamo")  # what launch imports first, before the load
    hogs = 6 * (os.cpu_count() or 1)
    with _busy_loops(hogs):
        time.sleep(0.5)
        t0 = time.monotonic()
        got = minidist.launch(computes_then_reduces, 2, 0.5, timeout_s=120, idle_s=1, cpu_s=2)
        wall = time.monotonic() - t0
    assert got == [2.0, 2.0]
    print(f"a 0.5-CPU-second world under {hogs} busy processes: {wall:.1f} s by the clock")


def test_a_hung_world_on_a_loaded_core_is_stopped_as_idle_not_at_its_timeout():
    """Twelve busy processes and the world's ranks on one core: the rank inside the
    collective blocks, but gloo's transport thread still wakes ~85 times a second and each
    wake-up waits for the core. Counted as demand, it kept the world "busy" until its
    timeout (3 runs of 3; make test's sequence-parallel catalogue took 253 s at load 10)."""
    importlib.import_module("torch._dynamo")
    core = sorted(os.sched_getaffinity(0))[:1]
    mine = os.sched_getaffinity(0)
    with _busy_loops(12, core):
        os.sched_setaffinity(0, core)  # the forked ranks inherit it
        try:
            t0 = time.monotonic()
            with pytest.raises(minidist.WorldTimeoutError) as info:
                minidist.launch(all_reduce_while_rank_one_sleeps, 2, timeout_s=30, idle_s=1)
            wall = time.monotonic() - t0
        finally:
            os.sched_setaffinity(0, mine)
    assert info.value.why == "idle" and wall < 20, (wall, str(info.value))


@contextlib.contextmanager
def _busy_loops(n: int, core: list[int] | None = None):
    """`n` processes spinning a core each (all on `core` when given), killed on exit."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        for hog in hogs if core else []:
            os.sched_setaffinity(hog.pid, core)
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def test_a_hang_names_the_ranks_inside_a_collective_and_the_call():
    with pytest.raises(minidist.WorldTimeoutError) as info:
        minidist.launch(all_reduce_while_rank_one_sleeps, 2, timeout_s=3)
    where = info.value.where
    assert where[0].startswith("inside all_reduce (tag 'stuck') over 2 ranks in ")
    assert "in all_reduce_while_rank_one_sleeps at test_runtime.py:" in where[0]
    assert where[1] == "not inside a collective"
    assert "rank 0: inside all_reduce" in str(info.value)


def test_the_call_board_reads_back_each_state(tmp_path):
    from minidist.runtime.board import CallBoard, create_board, read_board

    path = str(tmp_path / "board")
    create_board(path, 3)
    boards = [CallBoard(path, r) for r in range(3)]
    boards[0].enter("all_gather", "fsdp", 3)
    boards[1].enter("batch_isend_irecv", "", 3)
    boards[1].leave(async_op=True)
    where = read_board(path, [0, 1, 2])
    assert where[0].startswith("inside all_gather (tag 'fsdp') over 3 ranks in ")
    assert where[1].startswith("not inside a blocking call; its last call, asynchronous, may")
    assert where[2] == "not inside a collective"
    boards[0].leave()
    assert read_board(path, [0])[0].startswith("not inside a collective (its last call: all_")


def kill_self_among_collectives(folder):
    """Both ranks all-reduce in a loop; after some rounds rank 1 SIGKILLs itself."""
    for step in range(10_000):
        comm.all_reduce(torch.ones(64))
        if dist.get_rank() == 1 and step == 20:
            os.write(2, b"rank 1 about to be killed (minidist test)\n")
            os.kill(os.getpid(), signal.SIGKILL)


def test_the_rank_killed_by_a_signal_is_named_first_with_its_stderr(tmp_path):
    for _ in range(4):  # not by luck: the same answer every time
        with pytest.raises(minidist.RankFailedError) as info:
            minidist.launch(kill_self_among_collectives, 2, str(tmp_path), timeout_s=60)
        message = str(info.value)
        assert info.value.rank == 1, message
        assert "exited with code -9 (SIGKILL)" in message
        assert "rank 1 about to be killed (minidist test)" in message
        assert "failed after it" not in message  # rank 0 lost its peer, nothing else
    assert live_children() == []


def exit_without_result():
    if dist.get_rank() == 1:
        os._exit(3)
    dist.barrier()


def test_rank_that_dies_is_reported():
    with pytest.raises(minidist.RankFailedError, match="exited with code 3"):
        minidist.launch(exit_without_result, 2, timeout_s=30)
    assert live_children() == []


def wait_for_file(path, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


def abort_after_native_message(folder):
    # Rank 1 dies only once rank 0 is past rendezvous, so that rank 0 never fails too (in
    # init_process_group, as peers of a dead rank do) and races rank 1 to be reported.
    ready = os.path.join(folder, "rank0-joined")
    if dist.get_rank() == 0:
        open(ready, "w").close()
        return
    wait_for_file(ready)
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    os.write(2, b"noise that scrolls away\n" * 50)
    # What gloo writes from C++ right before abort(): no Python traceback follows.
    os.write(2, b"[enforce fail] Received data size doesn't match expected size (minidist)\n")
    os.abort()


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_rank_killed_by_abort_reports_its_last_stderr_lines(start_method, tmp_path, capfd):
    """Under pytest (faulthandler on) a forked rank's abort dumps its Python stack with the
    rest of its stderr, to the parent, not to the terminal pytest's faulthandler holds; the
    error keeps the native line before the dump, and the dump's first line."""
    with pytest.raises(minidist.RankFailedError) as info:
        minidist.launch(
            abort_after_native_message, 2, str(tmp_path), start_method=start_method, timeout_s=60
        )
    message = str(info.value)
    assert info.value.rank == 1
    assert "exited with code -6 (SIGABRT)" in message
    assert "Received data size doesn't match expected size (minidist)" in message
    assert message.count("noise that scrolls away") < 50  # a tail, not everything
    assert live_children() == []
    if start_method == "fork":  # a spawned rank starts without faulthandler
        assert faulthandler.is_enabled()
        assert "Fatal Python error: Aborted" in message
        assert "in abort_after_native_message" in capfd.readouterr().err  # forwarded


FLOOD_LINES = 2000  # of 110 bytes: 220 KB, far above a pipe buffer (64 KiB)


def flood_stderr():
    data = f"rank {dist.get_rank()} floods: {'x' * 94}\n".encode() * FLOOD_LINES
    while data:
        data = data[os.write(2, data) :]
    return dist.get_rank()


def test_rank_writing_lots_to_stderr_completes_and_is_forwarded(capfd):
    t0 = time.monotonic()
    assert minidist.launch(flood_stderr, 2, timeout_s=60) == [0, 1]
    assert time.monotonic() - t0 < 30
    err = capfd.readouterr().err  # forwarded to the parent's file descriptor 2
    for rank in (0, 1):
        assert err.count(f"rank {rank} floods: ") == FLOOD_LINES
    assert live_children() == []


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_worlds_leave_no_file_descriptors_open(tmp_path):
    minidist.launch(rank_and_size, 2)  # first use may open lasting fds (imports, caches)
    before = open_fds()
    for i in range(3):
        minidist.launch(rank_and_size, 2)
        minidist.launch(flood_stderr, 2)
        (tmp_path / str(i)).mkdir()
        with pytest.raises(minidist.RankFailedError):
            minidist.launch(abort_after_native_message, 2, str(tmp_path / str(i)))
        with pytest.raises(minidist.RankFailedError):
            minidist.launch(fail_on_rank, 2, 1)
    assert open_fds() <= before  # none left open (imports may close some of their own)
    assert live_children() == []


def fail_while_rank_one_sleeps(folder):
    # Rank 0 fails only once rank 1 is past rendezvous: a rank still in init_process_group
    # would fail by itself when rank 0 exits, and the world would end fast for that reason.
    sleeping = os.path.join(folder, "rank1-sleeping")
    if dist.get_rank() == 0:
        wait_for_file(sleeping)
        raise ValueError("rank 0 fails at once")
    open(sleeping, "w").close()
    time.sleep(60)  # outside any collective: nothing makes this rank fail by itself


def test_failure_stops_ranks_outside_collectives_after_grace(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(minidist.RankFailedError, match="rank 0 fails at once") as info:
        minidist.launch(fail_while_rank_one_sleeps, 2, str(tmp_path), timeout_s=120)
    assert time.monotonic() - t0 < 20  # the grace period, not the 60 s sleep or the timeout
    assert info.value.rank == 0
    assert live_children() == []


def test_notebook_style_function_runs_under_spawn():
    # A function whose module cannot be imported by the child, as in a notebook cell.
    namespace = {"__name__": "__main__"}
    exec(
        textwrap.dedent(
            """
            import torch, torch.distributed as dist
            SCALE = 3
            def cell_fn(x):
                t = torch.tensor([float(dist.get_rank())])
                dist.all_reduce(t)
                return x * SCALE + t.item()
            """
        ),
        namespace,
    )
    assert minidist.launch(namespace["cell_fn"], 2, 1, start_method="spawn") == [4.0, 4.0]


def test_unpicklable_function_gets_a_clear_error():
    lock = threading.Lock()

    def uses_lock():
        with lock:
            return 1

    with pytest.raises(TypeError, match="cannot be pickled.*spawn"):
        minidist.launch(uses_lock, 2, start_method="spawn")


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_bad_world_size_is_named(bad):
    with pytest.raises(ValueError, match="world_size"):
        minidist.launch(rank_and_size, bad)


def test_bad_backend_and_timeout_are_named():
    with pytest.raises(ValueError, match="backend must be one of"):
        minidist.launch(rank_and_size, 2, backend="mpi-ish")
    for bad in (0, float("inf"), float("nan"), 1e9):  # 1e9: a wait's poll(2) overflows
        with pytest.raises(ValueError, match="timeout_s must be > 0 and finite, at most"):
            minidist.launch(rank_and_size, 2, timeout_s=bad)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="nccl.*one GPU per rank"):
            minidist.launch(rank_and_size, 2, backend="nccl")


def big_result():
    return torch.full((4_000_000,), float(dist.get_rank()))  # 16 MB, far above a pipe buffer


def test_large_results_come_back():
    results = minidist.launch(big_result, 2)
    assert [float(r[-1]) for r in results] == [0.0, 1.0]


def test_interrupt_reaps_children(tmp_path):
    script = tmp_path / "interrupted.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, signal, time, minidist
            # a shell's background job (a sweep under nohup) inherits SIGINT ignored
            signal.signal(signal.SIGINT, signal.default_int_handler)
            def sleeper():
                open(os.path.join({str(tmp_path)!r}, f"pid{{os.getpid()}}"), "w").close()
                time.sleep(600)
            minidist.launch(sleeper, 2, timeout_s=600)
            """
        )
    )
    proc = subprocess.Popen([sys.executable, str(script)])
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("pid*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [int(p.name[3:]) for p in tmp_path.glob("pid*")]
    assert len(pids) == 2
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    time.sleep(0.5)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize(
    "how, custom", [(signal.SIGKILL, False), (signal.SIGTERM, False), (signal.SIGKILL, True)]
)
def test_ranks_die_with_their_parent_and_its_folders_are_swept(tmp_path, monkeypatch, how, custom):
    """Killed outright, the parent takes its ranks along; the next launch removes what they
    left: the rendezvous folder and the disk-offload files, in TMPDIR or (custom) under the
    caller's `path=`, found through the markers left in TMPDIR."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    elsewhere = tmp_path / "mine"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("the caller's own file")
    path = repr(str(elsewhere)) if custom else None
    script = tmp_path / "killed.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, time, torch, minidist
            from minidist.offload import OffloadOptimizer
            def sleeper():
                p = torch.nn.Parameter(torch.ones(4))
                opt = OffloadOptimizer([p], tier="disk", path={path}, lr=0.1)
                open(os.path.join({str(tmp_path)!r}, f"pid{{os.getpid()}}"), "w").close()
                time.sleep(600)
            minidist.launch(sleeper, 2, timeout_s=600)
            """
        )
    )
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, str(script)], env=env)
    # generous: a process importing torch and starting 2 ranks took over 60 s at load 28
    deadline = time.monotonic() + 300
    while len(list(tmp_path.glob("pid*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [int(p.name[3:]) for p in tmp_path.glob("pid*")]
    assert len(pids) == 2
    offload = tmp if not custom else elsewhere
    assert len(list(offload.glob("minidist-offload-*"))) == 2  # each rank's files
    assert len(list(tmp.glob("minidist-*.where"))) == (2 if custom else 0)
    assert [p for p in tmp.glob("minidist-*") if p.is_dir() and "offload" not in p.name]
    proc.send_signal(how)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    minidist.launch(rank_and_size, 1)  # the next launch sweeps what the dead ones left
    assert list(tmp.glob("minidist-*")) == []  # (torch may keep its compile cache there)
    assert [p.name for p in elsewhere.iterdir()] == ["keep.txt"]


def test_a_marker_is_followed_only_to_a_folder_named_for_its_dead_pid(tmp_path, monkeypatch):
    """The sweep never removes a folder a marker names unless that folder's own name carries
    the same dead pid: a stale or forged marker costs only itself."""
    from minidist.runtime.parent import _sweep_stale

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    tmp, mine = tmp_path / "tmp", tmp_path / "mine"
    tmp.mkdir()
    mine.mkdir()
    targets = [
        mine / "important",
        mine / f"minidist-offload-{os.getpid()}-x",
        mine / f"minidist-offload-{dead.pid}-y",
    ]
    for i, target in enumerate(targets):
        target.mkdir()
        (tmp / f"minidist-{dead.pid}-{i}.where").write_text(str(target))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    _sweep_stale()
    assert sorted(p.name for p in mine.iterdir()) == sorted(t.name for t in targets[:2])
    assert list(tmp.iterdir()) == []


def test_joins_a_torchrun_world(tmp_path):
    script = tmp_path / "under_torchrun.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch, torch.distributed as dist, minidist
            def fn():
                t = torch.ones(1)
                dist.all_reduce(t)
                return (dist.get_rank(), t.item())
            results = minidist.launch(fn, 2)
            if dist.get_rank() == 0:
                print("RESULTS", results)
            dist.destroy_process_group()
            """
        )
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(script),
    ]
    # TMPDIR: torchrun's own log folders (torchelastic_*), which it leaves, in tmp_path
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "RESULTS [(0, 2.0), (1, 2.0)]" in out.stdout


def big_matmul():
    x = torch.randn(512, 512)
    return float((x @ x).sum()) * 0 + torch.get_num_threads()


def test_forked_world_of_one_after_the_parent_computed_does_not_hang():
    """GNU OpenMP hangs in a forked child that starts a thread team after the parent ran one:
    forked ranks get one intra-op thread."""
    torch.set_num_threads(2)
    torch.randn(512, 512) @ torch.randn(512, 512)  # the parent runs a parallel region
    assert minidist.launch(big_matmul, 1, timeout_s=30) == [1]
    with pytest.raises(ValueError, match="threads_per_rank=2 needs start_method='spawn'"):
        minidist.launch(big_matmul, 1, start_method="fork", threads_per_rank=2)


def test_default_backend_is_gloo_even_with_gpus(monkeypatch):
    """The course's tensors live on the CPU: NCCL only on request (several-GPU machines)."""
    monkeypatch.delenv("MINIDIST_BACKEND", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert default_backend(4) == "gloo"
    monkeypatch.setenv("MINIDIST_BACKEND", "nccl")
    assert default_backend(4) == "nccl"


def test_bad_minidist_backend_is_named(monkeypatch):
    monkeypatch.setenv("MINIDIST_BACKEND", "mpi")
    with pytest.raises(ValueError, match="MINIDIST_BACKEND must be one of .* got 'mpi'"):
        default_backend(2)
    monkeypatch.setenv("MINIDIST_BACKEND", "nccl")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="world_size=4, GPUs=1"):
        default_backend(4)


def rank_device_name():
    return str(minidist.rank_device())


def test_device_picks_the_backend_and_refuses_too_few_gpus(monkeypatch):
    from minidist.runtime import world_backend

    monkeypatch.delenv("MINIDIST_BACKEND", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert world_backend("cpu", None, 4) == "gloo"
    assert world_backend("auto", None, 2) == "nccl"  # enough GPUs: one per rank
    assert world_backend("auto", None, 4) == "gloo"  # too few: CPUs
    assert world_backend("cuda", None, 2) == "nccl"
    assert world_backend(None, "nccl", 2) == "nccl"  # backend= as before
    assert world_backend(None, None, 4) == "gloo"
    with pytest.raises(ValueError, match="needs one GPU per rank: 4 ranks but 2 GPUs"):
        world_backend("cuda", None, 4)
    with pytest.raises(ValueError, match="device='cpu' runs on backend 'gloo', but backend='nccl'"):
        world_backend("cpu", "nccl", 2)
    with pytest.raises(ValueError, match="device must be one of .* got 'tpu'"):
        world_backend("tpu", None, 2)


def test_rank_device_is_the_cpu_under_gloo():
    assert minidist.rank_device() == torch.device("cpu")  # outside any world
    assert minidist.launch(rank_device_name, 2, device="cpu") == ["cpu", "cpu"]
    if not torch.cuda.is_available():
        assert minidist.launch(rank_device_name, 1, device="auto") == ["cpu"]
        with pytest.raises(ValueError, match="2 ranks but 0 GPUs"):
            minidist.launch(rank_device_name, 2, device="cuda")


def test_a_fatal_error_line_written_in_parts_is_kept_whole():
    """faulthandler writes "Fatal Python error: " and "Aborted" in separate writes; the
    parent read the first alone (make test, once in 3,176) and the error ended mid-line."""
    from minidist.runtime.stderr import _StderrTail

    read_end, write_end = multiprocessing.Pipe(duplex=False)
    tail = _StderrTail(read_end)
    try:
        fd = write_end.fileno()
        for part in (b"gloo: size mismatch\nFatal Python error: ", b"Abor", b"ted\n\nThread 0x1"):
            os.write(fd, part)
            tail.drain()
        os.write(fd, b" (most recent call first):\n  File x\n" * 100)
        tail.drain()
    finally:
        write_end.close()
        tail.close()
    assert tail.last_lines() == "gloo: size mismatch\nFatal Python error: Aborted"
