"""Lesson 16's checkers: the right answers pass; each catalogued mistake is named."""

import math

import pytest
import torch

from minidist.course.check import CheckFailed
from minidist.expert_parallel.check import check_dispatch, check_load_balancing_loss
from minidist.expert_parallel.routing import dispatch, load_balancing_loss


def _with(cap, order=lambda m, c: (m[:c], m[c:])):
    def fn(ids, e, cf):
        c = max(cap(ids.numel(), e, cf), 0)
        return [order(torch.nonzero(ids == x).flatten(), c) for x in range(e)]

    return fn


def _shared(ids, e, cf):
    budget = _ceil(ids.numel(), e, cf) * e
    return [
        (m[m < budget], m[m >= budget]) for m in (torch.nonzero(ids == x)[:, 0] for x in range(e))
    ]


def _ceil(t, e, cf):
    return math.ceil(cf * t / e)


DISPATCH_MISTAKES = {
    "floor": (_with(lambda t, e, cf: math.floor(cf * t / e)), "floor"),
    "round": (_with(lambda t, e, cf: round(cf * t / e)), "round"),
    "no division by E": (_with(lambda t, e, cf: math.ceil(cf * t)), "divide by E"),
    "no capacity factor": (_with(lambda t, e, cf: math.ceil(t / e)), "capacity_factor is missing"),
    "C + 1": (_with(lambda t, e, cf: _ceil(t, e, cf) + 1), "one token too many"),
    "C - 1": (_with(lambda t, e, cf: _ceil(t, e, cf) - 1), "one token too few"),
    "last C kept": (
        _with(_ceil, lambda m, c: (m[max(len(m) - c, 0) :], m[: max(len(m) - c, 0)])),
        "LAST C",
    ),
    "kept reversed": (_with(_ceil, lambda m, c: (m[:c].flip(0), m[c:])), "wrong order"),
    "nothing dropped reported": (_with(_ceil, lambda m, c: (m[:c], m[:0])), "drops"),
    "one budget shared by all experts": (_shared, "OWN capacity"),
    "one pair in all": (
        lambda ids, e, cf: dispatch(ids, e, cf)[:1],
        "one \\(kept, dropped\\) pair",
    ),
    "crash": (lambda ids, e, cf: ids[ids.numel() + 3], "raised IndexError"),
}


def test_right_dispatch_passes(capsys):
    check_dispatch(dispatch)
    assert "PASSED" in capsys.readouterr().out


def test_dispatch_accepts_lists():
    check_dispatch(lambda ids, e, cf: [(k.tolist(), d.tolist()) for k, d in dispatch(ids, e, cf)])


@pytest.mark.parametrize("name", list(DISPATCH_MISTAKES))
def test_each_dispatch_mistake_is_named(name):
    fn, words = DISPATCH_MISTAKES[name]
    with pytest.raises(CheckFailed, match=words):
        check_dispatch(fn)


def _f(probs, ids):
    return torch.bincount(ids, minlength=probs.shape[-1]).to(probs.dtype) / ids.numel()


def _gates(probs, ids):
    chosen = probs.gather(-1, ids[:, None]).squeeze(-1)
    return torch.zeros(probs.shape[-1], dtype=probs.dtype).index_add(0, ids, chosen) / ids.numel()


AUX_MISTAKES = {
    "no E": (lambda p, i: (_f(p, i) * p.mean(0)).sum(), "factor E is missing"),
    "mean over experts": (
        lambda p, i: p.shape[-1] * (_f(p, i) * p.mean(0)).mean(),
        "became a mean",
    ),
    "E squared": (lambda p, i: p.shape[-1] ** 2 * (_f(p, i) * p.mean(0)).sum(), "E appears twice"),
    "counts": (lambda p, i: load_balancing_loss(p, i) * i.numel(), "T times too large"),
    "sum of probs": (
        lambda p, i: p.shape[-1] * (_f(p, i) * p.sum(0)).sum(),
        "T times too large",
    ),
    "gates instead of fractions": (
        lambda p, i: p.shape[-1] * (_gates(p, i) * p.mean(0)).sum(),
        "gates",
    ),
    "f times f": (lambda p, i: p.shape[-1] * (_f(p, i) ** 2).sum(), "f_e · f_e"),
    "P times P": (lambda p, i: p.shape[-1] * (p.mean(0) ** 2).sum(), "P_e · P_e"),
    "P over routed tokens": (
        lambda p, i: (
            p.shape[-1]
            * (_gates(p, i) * i.numel() / torch.bincount(i, minlength=p.shape[-1]).clamp_min(1))
            .mul(_f(p, i))
            .sum()
        ),
        "routed to e only",
    ),
    "alpha inside": (lambda p, i: 0.01 * load_balancing_loss(p, i), "α = 0.01"),
    "detached": (lambda p, i: load_balancing_loss(p.detach(), i), "no gradient"),
    "python float": (lambda p, i: float(load_balancing_loss(p, i).detach()), "one-element tensor"),
    "per-expert vector": (
        lambda p, i: p.shape[-1] * _f(p, i) * p.mean(0),
        "one-element tensor",
    ),
    "crash": (lambda p, i: p[i.numel() + 50], "raised IndexError"),
}


def test_right_aux_loss_passes(capsys):
    check_load_balancing_loss(load_balancing_loss)
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize("name", list(AUX_MISTAKES))
def test_each_aux_mistake_is_named(name):
    fn, words = AUX_MISTAKES[name]
    with pytest.raises(CheckFailed, match=words):
        check_load_balancing_loss(fn)


def test_catalogues_have_at_least_eight():
    assert len(DISPATCH_MISTAKES) >= 8 and len(AUX_MISTAKES) >= 8
