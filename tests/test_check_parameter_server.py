"""The lesson 12 checkers pass right answers and name the mistake in wrong ones."""

import pytest

from minidist.course.check import CheckFailed
from minidist.parameter_server.check import (
    check_link_class_bytes,
    check_may_proceed,
    simulate_ssp,
)

# -- exercise 1: SSP's admission rule ---------------------------------------------------------


def rule_right(worker_clock, clocks, staleness):
    return worker_clock - min(clocks) <= staleness


def rule_off_by_one(worker_clock, clocks, staleness):
    return worker_clock - min(clocks) < staleness


def rule_fastest(worker_clock, clocks, staleness):
    return worker_clock - max(clocks) <= staleness  # always True: async in disguise


def rule_fastest_gap(worker_clock, clocks, staleness):
    return max(clocks) - worker_clock <= staleness


def rule_no_staleness(worker_clock, clocks, staleness):
    return worker_clock <= min(clocks)


def rule_async(worker_clock, clocks, staleness):
    return True


def rule_int(worker_clock, clocks, staleness):
    return int(worker_clock - min(clocks) <= staleness)


def rule_other(worker_clock, clocks, staleness):
    return worker_clock - min(clocks) <= staleness + 1


def rule_stub(worker_clock, clocks, staleness):
    raise NotImplementedError("exercise: replace this line with your code")


def test_may_proceed_passes(capsys):
    check_may_proceed(rule_right)
    out = capsys.readouterr().out
    assert "PASSED" in out and "for s = 0, 1, 2: [0, 1, 2]" in out
    assert "on 1220 cases" in out  # the same count a failure reports


def test_may_proceed_catalogue_is_large_enough():
    assert len(RULE_MISTAKES) >= 8


RULE_MISTAKES = [
    (rule_off_by_one, r"off by one: .* c - slowest < s"),
    (rule_fastest, r"always says yes(.|\n)*the fastest worker, c - max\(clocks\) <= s"),
    (rule_fastest_gap, "behind the fastest"),
    (lambda c, clocks, s: c - max(clocks) < s, "you compared with the fastest worker"),
    (rule_no_staleness, "you ignored the staleness s"),
    (rule_async, "always says yes: that is the asynchronous"),
    (rule_int, "returned 1; return a bool"),
    (rule_other, r"one clock too many.*E.g. a worker at clock \d"),
    (lambda c, clocks, s: c - sum(clocks) / len(clocks) <= s, "average clock"),
    (lambda c, clocks, s: c <= s, "with s alone"),
    (lambda c, clocks, s: max(clocks) - min(clocks) <= s, "bounded the spread"),
    (lambda c, clocks, s: c - min(clocks) > s, "inverted"),
    (lambda c, clocks, s: min(clocks) - c <= s, "the wrong way round"),
    (
        lambda c, clocks, s: c - min(clocks) <= s if s < 3 else c - min(clocks) <= 2,
        r"too strict\), for s in \[3\]",
    ),
    (lambda c, clocks, s: c - clocks[0] <= s, r"of 1220 cases differ"),
    (lambda c, clocks: True, "TypeError.*an int, a list of ints"),
]


@pytest.mark.parametrize("impl, hint", RULE_MISTAKES)
def test_may_proceed_names_the_mistake(impl, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_may_proceed(impl)


def test_may_proceed_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_may_proceed(rule_stub)


def test_simulation_bounds_the_lead_and_names_a_deadlock():
    assert max(simulate_ssp(rule_right, 2)) == 2
    assert max(simulate_ssp(rule_async, 2)) > 2  # unbounded: the fast workers run away
    with pytest.raises(CheckFailed, match="deadlock"):
        simulate_ssp(rule_off_by_one, 0)


# -- exercise 2: a two-level all-reduce's bytes per link class --------------------------------


def bytes_right(numel, inner_size, outer_size, element_size):
    size = numel * element_size
    return {
        "inner": 2 * (inner_size - 1) / inner_size * size,
        "outer": 2 * (outer_size - 1) / outer_size * size / inner_size,
    }


def bytes_no_1_over_i(numel, inner_size, outer_size, element_size):
    size = numel * element_size
    return {
        "inner": 2 * (inner_size - 1) / inner_size * size,
        "outer": 2 * (outer_size - 1) / outer_size * size,
    }


def bytes_all_gather_twice(numel, inner_size, outer_size, element_size):
    size = numel * element_size
    return {
        "inner": 3 * (inner_size - 1) / inner_size * size,
        "outer": 2 * (outer_size - 1) / outer_size * size / inner_size,
    }


def bytes_reduce_scatter_only(numel, inner_size, outer_size, element_size):
    size = numel * element_size
    return {
        "inner": (inner_size - 1) / inner_size * size,  # the all-gather forgotten
        "outer": 2 * (outer_size - 1) / outer_size * size / inner_size,
    }


def bytes_reduce_scatter_only_whole_outer(numel, inner_size, outer_size, element_size):
    size = numel * element_size
    return {
        "inner": (inner_size - 1) / inner_size * size,
        "outer": 2 * (outer_size - 1) / outer_size * size,  # the 1/I missing too
    }


def bytes_swapped(numel, inner_size, outer_size, element_size):
    return bytes_right(numel, outer_size, inner_size, element_size)


def bytes_tuple(numel, inner_size, outer_size, element_size):
    return tuple(bytes_right(numel, inner_size, outer_size, element_size).values())


def bytes_flat_inner(numel, inner_size, outer_size, element_size):
    n = inner_size * outer_size
    return {"inner": 2 * (n - 1) / n * numel * element_size, "outer": 0.0}


def bytes_stub(numel, inner_size, outer_size, element_size):
    raise NotImplementedError("exercise: replace this line with your code")


def test_link_class_bytes_passes(capsys):
    check_link_class_bytes(bytes_right)
    out = capsys.readouterr().out
    assert "PASSED" in out and "inner 4096 B, outer 2048 B per rank" in out
    assert "I = 8, O = 4, 4096 float32: inner 28672 B, outer 3072 B" in out


def test_link_class_bytes_catalogue_is_large_enough():
    assert len(LINK_MISTAKES) >= 8


def bytes_with(inner, outer):
    """A two-level answer from formulas of (I, O, M bytes, numel, element size)."""

    def link_class_bytes(numel, inner_size, outer_size, element_size):
        args = (inner_size, outer_size, numel * element_size, numel, element_size)
        return {"inner": inner(*args), "outer": outer(*args)}

    return link_class_bytes


def ring(k, n, m):
    return k * (n - 1) / n * m


RIGHT_INNER = lambda i, o, m, n, e: ring(2, i, m)  # noqa: E731
RIGHT_OUTER = lambda i, o, m, n, e: ring(2, o, m / i)  # noqa: E731
LINK_MISTAKES = [
    (bytes_no_1_over_i, "the outer links: you counted an all-reduce of the whole tensor"),
    (bytes_all_gather_twice, "you counted the all-gather twice"),
    (bytes_reduce_scatter_only, "inner links: off by 2x"),
    (bytes_reduce_scatter_only_whole_outer, r"inner links: off by 2x.*outer links: you counted"),
    (
        bytes_swapped,
        "inner links: the inner and outer group sizes are swapped.*outer links: the "
        "inner and outer",
    ),
    (bytes_tuple, r"returned \("),
    (bytes_flat_inner, "flat all-reduce over all.*outer links: 0 on every mesh"),
    (bytes_with(RIGHT_INNER, lambda i, o, m, n, e: ring(2, o, m / o)), "not 1/O"),
    (bytes_with(RIGHT_INNER, lambda i, o, m, n, e: ring(1, o, m / i)), "you counted half"),
    (bytes_with(lambda i, o, m, n, e: 2 * m, RIGHT_OUTER), "inner links: you counted the payload"),
    (bytes_with(RIGHT_INNER, lambda i, o, m, n, e: 2 * m / i), "outer links: you counted the pay"),
    (
        bytes_with(lambda i, o, m, n, e: ring(2, i, n), lambda i, o, m, n, e: ring(2, o, n / i)),
        "inner links: elements, not bytes.*outer links: elements",
    ),
    (bytes_with(lambda i, o, m, n, e: ring(2, i, 4 * n), RIGHT_OUTER), "4-byte elements"),
    (bytes_with(lambda i, o, m, n, e: ring(2, i, 8 * m), RIGHT_OUTER), "bits, not bytes"),
    (bytes_with(lambda i, o, m, n, e: ring(2, i, m / i), RIGHT_OUTER), "only the outer"),
    (
        bytes_with(RIGHT_INNER, lambda i, o, m, n, e: ring(2, i, m) + ring(2, o, m / i)),
        "you added the inner bytes to the outer",
    ),
    (bytes_with(lambda i, o, m, n, e: m / (i - 1), RIGHT_OUTER), "ZeroDivisionError.*one rank"),
    (bytes_with(RIGHT_INNER, lambda i, o, m, n, e: ring(2, o, m / (i * o))), "divided\\s+by I·O"),
    (bytes_with(lambda i, o, m, n, e: 2 * ((i - 1) // i) * m, RIGHT_OUTER), "integer division"),
    (
        bytes_with(RIGHT_INNER, lambda i, o, m, n, e: 2 * ((o - 1) // o) * m / i),
        "O-1\\)//O, an integer division",
    ),
]


@pytest.mark.parametrize("impl, hint", LINK_MISTAKES)
def test_link_class_bytes_names_the_mistake(impl, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_link_class_bytes(impl)


def test_link_class_bytes_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_link_class_bytes(bytes_stub)
