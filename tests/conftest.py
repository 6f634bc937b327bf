import os

# Triton's interpreter must be chosen before torch or triton is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
# Every world the tests start runs under the device guard (minidist/device_guard.py): a
# tensor made by minidist's code without naming its device fails the test, as on a GPU.
os.environ.setdefault("MINIDIST_DEVICE_GUARD", "1")
# One intra-op thread in each test process and the kernels it starts, as in every forked
# rank (`launch`): the models are tiny, and a second OpenMP thread per process only adds
# switches on a machine whose cores the worlds already fill.
os.environ.setdefault("OMP_NUM_THREADS", "1")


import functools  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _device_guard_in_this_process():
    """The same guard around each test's own process (fixtures, references, checkers)."""
    from minidist.device_guard import no_implicit_device

    with no_implicit_device():
        yield


@pytest.fixture(autouse=True)
def _intra_op_threads_as_found():
    """A test that changes torch's thread count (to fork after a team of threads ran) leaves
    the next tests of its process one thread: with two, OpenMP's spinning threads made a
    later test's own compute cost 3-5 core-s where it costs 0.5 (make test, three workers)."""
    import torch

    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def run_tour_row(tmp_path_factory):
    """`run_tour_row(name)`: tour row `name` on 4 ranks, run once per session (the tour test
    and the planner's check both read it)."""
    from minidist.registry import tour_rows

    rows = tour_rows()

    @functools.cache
    def run(name: str):
        return rows[name](4, tmp_path_factory.mktemp("tour"))

    return run


# `make test` runs the tests and the notebooks (nbval) in one session on three workers
# (pytest-xdist, `-n 3 --dist loadfile`): a world of forked ranks waits in gloo, a grading
# test waits for its kernels, a notebook's kernel keeps about 1.2 cores busy, and one process
# alone leaves part of two cores idle. Each file runs whole on one worker, so that its
# module fixtures (a catalogue's shared worlds, the executed exercises) run once, and a
# notebook in one kernel; the files that read the session's tour rows run on one worker,
# so that the rows run once; the slowest files go first, so that no worker is left with one
# of them at the end; then the notebooks alternate with the other test files, so that a
# notebook's kernel shares the cores with a test rather than with another notebook.
_TOGETHER = {"tests/test_planner.py": "tests/test_bench_tour.py"}
_SLOWEST_FIRST = [  # measured one process alone, seconds (2 cores, quiet)
    "tests/test_compose_hf.py",  # 75, both cores busy
    "tests/test_grade.py",  # 75, waits on kernels and timeouts
    "tests/test_compose.py",  # 67
    "tests/test_bench_tour.py",  # 54 with test_planner.py's 11
    "tests/test_resilience_compose.py",  # 58
    "tests/test_grade_isolation.py",  # 43
    "tests/test_compose_fsdp.py",  # 40
    "tests/test_runtime.py",  # 30, waits on timeouts
    "tests/test_compose_theory.py",  # 36
    "tests/test_course.py",  # 33
    "tests/test_site.py",  # 33
]


def _work_order(scopes: list[str]) -> dict[str, int]:
    """scope -> its place: `_SLOWEST_FIRST`, then the other test files and the notebooks
    alternately, each in the order collected."""
    order = {path: i for i, path in enumerate(_SLOWEST_FIRST)}
    files = [s for s in scopes if s not in order and not s.endswith(".ipynb")]
    notebooks = [s for s in scopes if s.endswith(".ipynb")]
    for i, scope in enumerate(files):
        order[scope] = len(_SLOWEST_FIRST) + 2 * i
    for i, scope in enumerate(notebooks):
        order[scope] = len(_SLOWEST_FIRST) + 2 * i + 1
    return order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under `--dist loadfile`: files as units of work, `_TOGETHER`'s as one, in `_work_order`."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    if not all(hasattr(LoadFileScheduling, a) for a in ("_split_scope", "_assign_work_unit")):
        return None  # another xdist's internals: its own file order (slower, as correct)

    class SlowestFirst(LoadFileScheduling):
        order: dict[str, int] | None = None

        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return _TOGETHER.get(path, path)

        def _assign_work_unit(self, node) -> None:
            if self.order is None:  # the first call sees every unit of work
                self.order = _work_order(list(self.workqueue))
            first = min(self.workqueue, key=lambda scope: self.order.get(scope, len(self.order)))
            self.workqueue.move_to_end(first, last=False)
            super()._assign_work_unit(node)

    return SlowestFirst(config, log)
