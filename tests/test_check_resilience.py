"""The lesson 18 checkers pass right answers, report stubs as not implemented, and name the
mistake in each of a catalogue of wrong ones (CONTRIBUTING.md section 8)."""

import math

import pytest

from minidist.course.check import CheckFailed, Mistake, catalogue_messages, names_mistake
from minidist.resilience.check import check_checkpoint_interval, check_reshard_flat
from minidist.resilience.check.reshard import _pieces, reshard_reference
from minidist.resilience.theory import daly_interval, young_interval


def stub(*args):
    raise NotImplementedError("exercise: replace this line with your code")


# -- exercise 1: Young's and Daly's intervals --------------------------------------------------


def interval(young=None, daly=None, swap=False):
    """A learner's `checkpoint_interval` with Young's or Daly's part replaced."""

    def checkpoint_interval(d, m):
        y = young(d, m) if young else young_interval(d, m)
        dl = daly(d, m) if daly else daly_interval(d, m)
        return (dl, y) if swap else (y, dl)

    return checkpoint_interval


def series(**flags):
    def daly(d, m):
        if flags.get("cap", True) and d >= flags.get("cap_at", 2) * m:
            return m
        x = d / (2 * m) if flags.get("half", True) else d / m
        if flags.get("slash_times"):
            x = d / 2 * m  # the learner's d/2*m
        if flags.get("floor"):
            x = d // (2 * m)
        root = (lambda v: v**1 / 2) if flags.get("slip") else math.sqrt  # the learner's ** 1/2
        third = (root(x) if flags.get("sqrt", True) else x) / 3 * flags.get("third", 1)
        t = root(2 * d * m) * (1 + third + x / 9 * flags.get("ninth", 1))
        return t - d * flags.get("minus", 1)

    return daly


def both_wrong(d, m):
    """Young without its 2 on small δ, without its root on large δ: no one slip explains it."""
    y = math.sqrt(d * m) if d < 100 else 2 * d * m
    return y, daly_interval(d, m)


def raises(d, m):
    return (young_interval(d, m), math.sqrt(2 * d * m - d * d * 4))  # negative when δ large


INTERVAL_MISTAKES = [
    Mistake("no 2", (interval(young=lambda d, m: math.sqrt(d * m)),), "factor 2"),
    Mistake("no sqrt", (interval(young=lambda d, m: 2 * d * m),), "square root is missing"),
    Mistake("δ/M", (interval(young=lambda d, m: math.sqrt(2 * d / m)),), "δ divided by M"),
    Mistake("hours", (interval(young=lambda d, m: young_interval(d, m) / 3600),), "hours"),
    Mistake("minutes", (interval(young=lambda d, m: young_interval(d, m) / 60),), "minutes"),
    Mistake(
        "M in hours, young",
        (interval(young=lambda d, m: math.sqrt(2 * d * m / 3600)),),
        "M taken in hours",
    ),
    Mistake("swapped", (interval(swap=True),), "swapped"),
    Mistake("no -δ", (interval(daly=series(minus=0)),), "without its −δ"),
    Mistake("no third", (interval(daly=series(third=0)),), "without its ⅓"),
    Mistake("no ninth", (interval(daly=series(ninth=0)),), "without its \\(1/9\\)"),
    Mistake("no sqrt in third", (interval(daly=series(sqrt=False)),), "the ⅓ term is ⅓·√"),
    Mistake("δ/M in daly", (interval(daly=series(half=False)),), "the ratio is δ/\\(2M\\)"),
    Mistake("daly = young", (interval(daly=young_interval),), "Young's interval for Daly's"),
    Mistake("no cap", (interval(daly=series(cap=False)),), "δ ≥ 2M not handled"),
    Mistake("a single number", (young_interval,), "return a pair"),
    Mistake("** 1/2 in young", (interval(young=lambda d, m: (2 * d * m) ** 1 / 2),), r"\*\* 1/2"),
    Mistake("** 1/2 in daly", (interval(daly=series(slip=True)),), r"√ written \*\* 1/2"),
    Mistake("d/2*M", (interval(daly=series(slash_times=True)),), r"\(δ/2\)·M.*bracket"),
    Mistake("integer division", (interval(daly=series(floor=True)),), "integer .floor. division"),
    Mistake(
        "M in hours", (interval(daly=lambda d, m: daly_interval(d, m / 3600)),), "M taken in hours"
    ),
    Mistake("round young", (interval(young=lambda d, m: round(young_interval(d, m))),), "rounded"),
    Mistake("round daly", (interval(daly=lambda d, m: round(daly_interval(d, m))),), "rounded"),
    Mistake("cap at δ ≥ M", (interval(daly=series(cap_at=1)),), r"cap at δ ≥ M.*δ ≥ 2M"),
    Mistake(
        "no single slip", (both_wrong,), r"young = [\d.e+]+ s; want .*Young 1974: √\(2·δ·M\)\)$"
    ),
    Mistake("math domain", (raises,), "δ ≥ 2M"),
]


@pytest.fixture(scope="module")
def interval_messages():
    return catalogue_messages(check_checkpoint_interval, INTERVAL_MISTAKES)


@pytest.mark.parametrize("mistake", INTERVAL_MISTAKES, ids=lambda m: m.name)
def test_interval_mistakes_are_named(mistake, interval_messages):
    assert names_mistake(mistake, interval_messages[mistake.name]) is None


def test_interval_right_answer_and_stub(capsys):
    check_checkpoint_interval(interval())
    assert "PASSED" in capsys.readouterr().out
    with pytest.raises(NotImplementedError):
        check_checkpoint_interval(stub)


# -- exercise 2: a saved flat ZeRO buffer, read by a new layout --------------------------------


def reading(**flags):
    return lambda n, d, d2, r2: _pieces(n, d, d2, r2, **flags)


def with_empty(n, d, d2, r2):
    return [(0, 0, 0)] + reshard_reference(n, d, d2, r2)


def as_dicts(n, d, d2, r2):
    return {p[0]: p[1:] for p in reshard_reference(n, d, d2, r2)}


def floor_div(n, d, d2, r2):
    per = n // d
    assert n // per >= d  # ZeroDivisionError when numel < saved_world
    return reshard_reference(n, d, d2, r2)


def stop_short_then_past(n, d, d2, r2):
    """Stops one short on even new ranks, one past on odd ones: no one slip explains it."""
    return _pieces(n, d, d2, r2, stop_shift=-1 if r2 % 2 == 0 else 1)


RESHARD_MISTAKES = [
    Mistake("floor", (reading(chunk=lambda a, b: a // b),), r"numel // world"),
    Mistake("swapped worlds", (reading(swap=True),), "worlds swapped"),
    Mistake("round", (reading(chunk=lambda a, b: round(a / b)),), r"round\(numel / world\)"),
    Mistake("global offsets", (reading(local=False),), "offsets in the whole flat buffer"),
    Mistake("modulo the new shard", (reading(modulo_new=True),), "modulo the new shard size"),
    Mistake("no single slip", (stop_short_then_past,), r"returned .*, want .*read each overlap"),
    Mistake("stop short", (reading(stop_shift=-1),), "one short"),
    Mistake("stop past", (reading(stop_shift=1),), "one past"),
    Mistake("padding", (reading(pad=True),), "padding read"),
    Mistake("first only", (reading(first_only=True),), "only the first"),
    Mistake("reversed", (reading(reverse=True),), "reverse order"),
    Mistake("next rank", (reading(rank_shift=1),), "next rank's pieces"),
    Mistake("a dict", (as_dicts,), "return a list"),
    Mistake("division by zero", (floor_div,), "ceil\\(numel / world\\)"),
]


@pytest.fixture(scope="module")
def reshard_messages():
    return catalogue_messages(check_reshard_flat, RESHARD_MISTAKES)


@pytest.mark.parametrize("mistake", RESHARD_MISTAKES, ids=lambda m: m.name)
def test_reshard_mistakes_are_named(mistake, reshard_messages):
    assert names_mistake(mistake, reshard_messages[mistake.name]) is None


def test_reshard_right_answer_empty_pieces_allowed_and_stub(capsys):
    check_reshard_flat(reshard_reference)
    check_reshard_flat(with_empty)
    assert capsys.readouterr().out.count("PASSED") == 2
    with pytest.raises(NotImplementedError):
        check_reshard_flat(stub)
    with pytest.raises(CheckFailed):
        check_reshard_flat(reading(stop_shift=1))
