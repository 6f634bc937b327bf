import os

# Triton's interpreter must be chosen before torch or triton is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")


import functools  # noqa: E402

import pytest  # noqa: E402


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
