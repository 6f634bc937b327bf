"""Plant each bug of `catalogue.MUTANTS` one at a time and run its package's tests.

Not part of the test suite: a check of the tests themselves (issue 19). Run it in a copy of
the repository, never in a working tree with edits you care about (it rewrites files and
restores them after each bug):

    git worktree add /tmp/minidist-sweep HEAD
    cd /tmp/minidist-sweep && PYTHONPATH=$PWD python tests/mutants/sweep.py [package ...]

On a machine others share, `MINIDIST_SWEEP_LOCK=FILE` runs each pytest (one per bug, and
each package's baseline) under `flock FILE`, so the sweep holds the lock a bug at a time.
`MINIDIST_SWEEP_ONLY=TEXT` plants only the bugs whose description contains TEXT, and
`MINIDIST_SWEEP_NO_BASELINE=1` skips the baseline runs (when they passed in a run before).

First each package's tests run once without a bug (a failing or hanging suite would
"catch" everything): a package whose tests fail then is reported, with what failed, and
skipped. Per bug it prints caught (and the test that failed) or SURVIVED; at the end
caught/total per package. A bug whose text is not in
its file exactly once is reported as "bad" and not counted.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import catalogue  # noqa: E402
from catalogue import MUTANTS  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT_S = 900


def tests_of(package: str) -> list[str]:
    """A package's tests: tests/test_<package>*.py, test_check_<package>.py and the few
    whose names differ from the package's. A bug is filed under the lesson whose tests pin
    it: lesson 14's in megatron/sequence.py under sequence_parallel, lesson 16's router
    under expert_parallel (tests/test_expert_parallel_routing.py among its tests)."""
    extra = {
        "fsdp": ["tests/test_checkpoint.py"],
        "pipeline": ["tests/test_bench_pp.py"],
        "parameter_server": ["tests/test_geeps_cache.py"],
        # issue 27's modules outside the lessons: comm.py's backend checks, the simulator
        "backends": ["tests/test_comm.py", "tests/test_comm_faults.py"],
        "pipeline_simulate": ["tests/test_pipeline.py"],
    }
    # run first (pytest -x stops at the first failure): the fast tests that pin the module,
    # before a suite that executes every notebook (course) or starts many worlds
    first = {
        "course": ["tests/test_course_cli.py", "tests/test_course_check.py"],
        "runtime": ["tests/test_bad_input.py", "tests/test_runtime_faults.py"],  # launch's checks
        "pipeline_simulate": ["tests/test_pipeline_simulate.py"],
        **getattr(catalogue, "TESTS", {}),
    }
    found = glob.glob(os.path.join(ROOT, f"tests/test_{package}*.py"))
    found += glob.glob(os.path.join(ROOT, f"tests/test_check_{package}.py"))
    found += [os.path.join(ROOT, p) for p in extra.get(package, [])]
    head = [os.path.join(ROOT, p) for p in first.get(package, [])]
    return head + sorted(set(found) - set(head))


def run(package: str) -> tuple[bool, str]:
    """(True if the package's tests fail (the bug is caught), what failed: pytest's FAILED or
    ERROR line, else the output's last line)."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:nbval",
        "-p",
        "no:cacheprovider",
        *tests_of(package),
    ]
    cmd = ["timeout", "-k", "10", str(TIMEOUT_S), *cmd]  # a hang is a failure (launch's)
    lock = os.environ.get("MINIDIST_SWEEP_LOCK")
    if lock:  # the limit starts once the lock is held: a wait for it is no hang
        cmd = ["flock", lock, *cmd]
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "TRITON_INTERPRET": "1"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True)
    if done.returncode in (124, 137):  # timeout's status for TERM, then KILL
        return True, f"timed out after {TIMEOUT_S} s"
    lines = done.stdout.decode(errors="replace").splitlines()
    failed = [x for x in lines if x.startswith(("FAILED ", "ERROR "))]
    return done.returncode != 0, (failed or lines or [""])[-1][:300]


def main(packages: list[str]) -> None:
    score: dict[str, list[int]] = {}
    baseline: dict[str, bool] = {}
    only = os.environ.get("MINIDIST_SWEEP_ONLY", "")
    skip_baseline = bool(os.environ.get("MINIDIST_SWEEP_NO_BASELINE"))  # run once already
    for package, path, old, new, what in MUTANTS:
        if (packages and package not in packages) or only not in what:
            continue
        if package not in baseline:
            failed, why = (False, "") if skip_baseline else run(package)
            baseline[package] = not failed
            if failed:
                print(f"baseline  {package:17} its tests fail without any bug, skipped: {why}")
        if not baseline[package]:
            continue
        full = os.path.join(ROOT, "minidist", path)
        with open(full) as f:
            source = f.read()
        if source.count(old) != 1:
            print(f"bad       {package:17} {path}: text found {source.count(old)} times ({what})")
            continue
        t0 = time.time()
        try:
            with open(full, "w") as f:
                f.write(source.replace(old, new))
            caught, why = run(package)
        finally:
            with open(full, "w") as f:
                f.write(source)
        score.setdefault(package, [0, 0])
        score[package][0] += caught
        score[package][1] += 1
        verdict = "caught  " if caught else "SURVIVED"
        print(f"{verdict}  {package:17} {path}: {what} ({time.time() - t0:.0f} s)", flush=True)
        if caught:  # which test failed: a flaky one would catch a bug it does not pin
            print(f"          by {why}", flush=True)
    total = [sum(c for c, _ in score.values()), sum(n for _, n in score.values())]
    for package, (c, n) in [*score.items(), ("all", total)]:
        print(f"{package:17} {c}/{n}")


if __name__ == "__main__":
    main(sys.argv[1:])
