import os

# Triton's interpreter must be chosen before torch or triton is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
# Every world the tests start runs under the device guard (minidist/device_guard.py): a
# tensor made by minidist's code without naming its device fails the test, as on a GPU.
os.environ.setdefault("MINIDIST_DEVICE_GUARD", "1")


import functools  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _device_guard_in_this_process():
    """The same guard around each test's own process (fixtures, references, checkers)."""
    from minidist.device_guard import no_implicit_device

    with no_implicit_device():
        yield


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
