"""Lesson 19's DualPipe bubble checker: right answers, written several ways, pass; each
catalogued mistake is named (one checker run per answer, all in this process)."""

import math

import numpy as np
import pytest

from minidist.course.check import Mistake, catalogue_messages, names_mistake
from minidist.deepseek.check.dualpipe_bubble import check_dualpipe_bubble

RIGHT = [
    lambda pp, F, B, W, FB: (pp / 2 - 1) * (FB + B - 3 * W),
    lambda pp, F, B, W, FB: (pp // 2 - 1) * (FB + B - 3 * W),  # pp is even
    lambda pp, F, B, W, FB: np.float64((pp - 2) / 2 * (B - 3 * W + FB)),
    lambda pp, F, B, W, FB: math.fsum([(pp / 2 - 1) * FB, (pp / 2 - 1) * B, -3 * (pp / 2 - 1) * W]),
]


@pytest.mark.parametrize("answer", RIGHT)
def test_right_bubble_passes(answer, capsys):
    check_dualpipe_bubble(answer)
    assert "PASSED" in capsys.readouterr().out


def _wrong(f):
    return (f,)


def _raises(pp, F, B, W, FB):
    raise ZeroDivisionError("division by zero")


MISTAKES = [
    Mistake("PP - 1", _wrong(lambda pp, F, B, W, FB: (pp - 1) * (FB + B - 3 * W)), r"PP/2 - 1"),
    Mistake("PP/2", _wrong(lambda pp, F, B, W, FB: pp / 2 * (FB + B - 3 * W)), r"never waits"),
    Mistake(
        "(PP-1)/2", _wrong(lambda pp, F, B, W, FB: (pp - 1) / 2 * (FB + B - 3 * W)), r"\(PP - 1\)/2"
    ),
    Mistake(
        "both directions", _wrong(lambda pp, F, B, W, FB: (pp - 2) * (FB + B - 3 * W)), r"twice"
    ),
    Mistake(
        "W twice",
        _wrong(lambda pp, F, B, W, FB: (pp / 2 - 1) * (FB + B - 2 * W)),
        r"W counted twice",
    ),
    Mistake(
        "W once", _wrong(lambda pp, F, B, W, FB: (pp / 2 - 1) * (FB + B - W)), r"subtracted once"
    ),
    Mistake(
        "F&B as F + B",
        _wrong(lambda pp, F, B, W, FB: (pp / 2 - 1) * (F + 2 * B - 3 * W)),
        r"F&B taken as F \+ B",
    ),
    Mistake(
        "no + B", _wrong(lambda pp, F, B, W, FB: (pp / 2 - 1) * (FB - 3 * W)), r"\+ B is missing"
    ),
    Mistake(
        "F for B",
        _wrong(lambda pp, F, B, W, FB: (pp / 2 - 1) * (FB + F - 3 * W)),
        r"F in place of B",
    ),
    Mistake("1F1B", _wrong(lambda pp, F, B, W, FB: (pp - 1) * (F + B)), r"1F1B's bubble"),
    Mistake("ZB1P", _wrong(lambda pp, F, B, W, FB: (pp - 1) * (F + B - 2 * W)), r"ZB1P's bubble"),
    Mistake(
        "off by one W",
        _wrong(lambda pp, F, B, W, FB: (pp / 2 - 1) * (FB + B - 3 * W) + W),
        r"got .* want .*\(PP/2 - 1\)",
    ),
    Mistake("a string", _wrong(lambda pp, F, B, W, FB: "0"), r"return a number"),
    Mistake("None", _wrong(lambda pp, F, B, W, FB: None), r"returned NoneType"),
    Mistake("raises", _wrong(_raises), r"ZeroDivisionError"),
]


@pytest.fixture(scope="module")
def messages():
    return catalogue_messages(check_dualpipe_bubble, MISTAKES)


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.name)
def test_each_bubble_mistake_is_named(mistake, messages):
    assert names_mistake(mistake, messages[mistake.name]) is None


def test_catalogue_has_at_least_eight():
    assert len(MISTAKES) >= 8
