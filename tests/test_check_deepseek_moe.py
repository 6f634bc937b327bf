"""Lesson 19's bias-update checker: right answers written several ways pass; each catalogued
mistake is named."""

import pytest
import torch

from minidist.course.check import CheckFailed, Mistake, catalogue_messages, names_mistake
from minidist.deepseek.check import check_bias_update


def _loop(bias, load, speed):
    mean = sum(load.tolist()) / len(load)
    out = bias.clone()
    for i, n in enumerate(load.tolist()):
        out[i] = bias[i] - speed * ((n > mean) - (n < mean))
    return out


RIGHT = [
    lambda b, n, s: b - s * torch.sign(n.float() - n.float().mean()).to(b.dtype),
    lambda b, n, s: b - s * torch.sign(n - n.double().mean()).to(b.dtype),
    lambda b, n, s: b + s * torch.sign(n.double().mean() - n).to(b.dtype),
    lambda b, n, s: b - s * torch.sign(n / n.sum() - 1 / n.numel()).to(b.dtype),  # fractions
    _loop,
]


@pytest.mark.parametrize("update", RIGHT)
def test_right_answers_pass(update, capsys):
    check_bias_update(update)
    assert "b − γ·sign(load − mean)" in capsys.readouterr().out


def _mean(n):
    return n.double().mean()


def _step(b, n, s, mean=None):
    """b − γ·sign(n − mean) in b's dtype (mean: the mean load by default)."""
    return b - s * torch.sign(n - (_mean(n) if mean is None else mean)).to(b.dtype)


def _in_place(b, n, s):
    b -= s * torch.sign(n - _mean(n)).to(b.dtype)
    return b


MISTAKES = [
    Mistake(
        "sign flipped",
        (lambda b, n, s: b + s * torch.sign(n - _mean(n)).to(b.dtype),),
        "sign is flipped",
    ),
    Mistake("proportional", (lambda b, n, s: b - s * (n - _mean(n)).to(b.dtype),), "proportional"),
    Mistake(
        "a tie moves",
        (lambda b, n, s: b - s * torch.where(n > _mean(n), 1, -1).to(b.dtype),),
        "exactly at the mean",
    ),
    Mistake(
        "integer mean", (lambda b, n, s: _step(b, n, s, n.sum() // len(n)),), "integer division"
    ),
    Mistake("no speed", (lambda b, n, s: b - torch.sign(n - _mean(n)).to(b.dtype),), "speed"),
    Mistake(
        "the change only",
        (lambda b, n, s: -s * torch.sign(n - _mean(n)).to(b.dtype),),
        "change .* alone",
    ),
    Mistake("against the sum", (lambda b, n, s: _step(b, n, s, n.sum()),), "MEAN"),
    Mistake("in place", (_in_place,), "in place"),
    Mistake(
        "float64 returned",
        (lambda b, n, s: b.double() - s * torch.sign(n - _mean(n)),),
        "keep bias's dtype",
    ),
    Mistake("a list", (lambda b, n, s: (b - s * torch.sign(n - _mean(n))).tolist(),), "list"),
    Mistake("no return", (lambda b, n, s: None,), "NoneType"),
    Mistake(
        "load doubled in place",
        (lambda b, n, s: _step(b, n.mul_(2), s),),
        "changed `load` in place",
    ),
    Mistake("mean of int64", (lambda b, n, s: b - s * torch.sign(n - n.mean()),), "load.float"),
    Mistake(
        "off by one expert",
        (lambda b, n, s: torch.cat([b[:1], _step(b, n, s)[1:]]),),
        r"expert 0 .* moved by 0",
    ),
]


def test_each_catalogued_mistake_is_named():
    messages = catalogue_messages(check_bias_update, MISTAKES)
    problems = [names_mistake(m, messages[m.name]) for m in MISTAKES]
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)


def test_a_failure_is_one_check_failed():
    with pytest.raises(CheckFailed, match="sign is flipped"):
        check_bias_update(MISTAKES[0].answer[0])
