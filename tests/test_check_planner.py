"""The planner checkers pass right answers, report stubs as not implemented, and name the
mistake in wrong ones (lesson 13's exercises)."""

import pytest

from minidist import comm
from minidist.course.check import CheckFailed
from minidist.planner.check import check_bytes_per_step, check_pipeline_prediction


def stub(*args):
    raise NotImplementedError("exercise: replace this line with your code")


# -- exercise 1: bytes per step ----------------------------------------------------------------


def make_bytes(pad=True, zero_gather=True, fsdp_gathers="fsdp", ring=True, element=4):
    def bytes_per_step(numels, world, zero):
        n = world

        def sent(op, size):
            return comm.ring_bytes(op, size, n) if ring else size * (2 if op == "all_reduce" else 1)

        if zero == 0:
            return sum(sent("all_reduce", element * e) for e in numels)
        padded = [element * (-(-e // n) * n if pad else e) for e in numels]
        total = sent("reduce_scatter", sum(padded))
        if zero in (1, 2):
            return total + (sent("all_gather", sum(padded)) if zero_gather else 0)
        gathers = {"fsdp": 2 * sum(padded) - padded[-1], "once": sum(padded),
                   "twice": 2 * sum(padded)}[fsdp_gathers]  # fmt: skip
        return total + sent("all_gather", gathers)

    return bytes_per_step


def test_bytes_per_step_passes(capsys):
    check_bytes_per_step(make_bytes())
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, words",
    [
        (make_bytes(pad=False), "padded to a multiple of N"),
        (make_bytes(zero_gather=False), "an all-gather puts the updated parameters back"),
        (make_bytes(fsdp_gathers="once"), "all-gathers them again for its backward"),
        (make_bytes(fsdp_gathers="twice"), "root unit"),
        (make_bytes(ring=False), r"\(N-1\)/N of the message"),
        (make_bytes(element=1), "in elements"),
    ],
)
def test_bytes_per_step_names_the_mistake(fn, words):
    with pytest.raises(CheckFailed, match=words):
        check_bytes_per_step(fn)


def test_bytes_per_step_wrong_type_is_named():
    with pytest.raises(CheckFailed, match="did not return a number"):
        check_bytes_per_step(lambda numels, world, zero: None)


def test_bytes_per_step_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_bytes_per_step(stub)


# -- exercise 2: bubble and activations of a pipeline -----------------------------------------


def make_pipeline(bubble="share", held="right"):
    def pipeline_prediction(pp, microbatches, schedule, microbatch_bytes):
        p, m = pp, microbatches
        b = {"share": (p - 1) / (m + p - 1), "ratio": (p - 1) / m, "p": p / (m + p)}[bubble]
        n = {
            "right": m if schedule == "gpipe" else min(p, m),
            "all": m,  # GPipe's count for 1F1B too
            "no_min": m if schedule == "gpipe" else p,
            "one_less": (m if schedule == "gpipe" else min(p, m)) - 1,
        }[held]
        return b, n * microbatch_bytes

    return pipeline_prediction


def test_pipeline_prediction_passes(capsys):
    check_pipeline_prediction(make_pipeline())
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, words",
    [
        (make_pipeline(bubble="ratio"), "idle time over the useful time"),
        (make_pipeline(bubble="p"), "p-1 slots, not p"),
        (make_pipeline(held="all"), "That is GPipe's peak"),
        (make_pipeline(held="no_min"), r"min\(p, m\)"),
        (make_pipeline(held="one_less"), "one more forward"),
    ],
)
def test_pipeline_prediction_names_the_mistake(fn, words):
    with pytest.raises(CheckFailed, match=words):
        check_pipeline_prediction(fn)


def test_pipeline_prediction_wrong_type_is_named():
    with pytest.raises(CheckFailed, match=r"\(bubble, activation_bytes\)"):
        check_pipeline_prediction(lambda *args: 0.5)


def test_pipeline_prediction_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_pipeline_prediction(stub)
