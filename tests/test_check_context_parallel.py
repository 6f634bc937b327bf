"""Lesson 15's checkers: the right answers pass; each catalogued mistake is named."""

import pytest
import torch

from minidist.context_parallel.check import check_block_attention, check_merge
from minidist.context_parallel.ring import block_attention, merge
from minidist.course.check import CheckFailed

NEG = float("-inf")


def _safe(x):
    return x.masked_fill(x == NEG, 0.0)


def _w(lse, new):
    return torch.exp(lse - _safe(new)).unsqueeze(-1)


MERGE_MISTAKES = {
    "no rescale": (lambda o, ls, ob, lb: (o + ob, torch.logaddexp(ls, lb)), "without rescaling"),
    "average": (lambda o, ls, ob, lb: ((o + ob) / 2, torch.logaddexp(ls, lb)), "plain average"),
    "running max": (
        lambda o, ls, ob, lb: (merge(o, ls, ob, lb)[0], torch.maximum(ls, lb)),
        "running MAX",
    ),
    "sum of lse": (lambda o, ls, ob, lb: (merge(o, ls, ob, lb)[0], ls + lb), "multiplies"),
    "one side rescaled": (
        lambda o, ls, ob, lb: (o * _w(ls, torch.logaddexp(ls, lb)) + ob, torch.logaddexp(ls, lb)),
        "only one side",
    ),
    "weights swapped": (
        lambda o, ls, ob, lb: (
            o * _w(lb, torch.logaddexp(ls, lb)) + ob * _w(ls, torch.logaddexp(ls, lb)),
            torch.logaddexp(ls, lb),
        ),
        "swapped",
    ),
    "NaN on empty rows": (
        lambda o, ls, ob, lb: (
            o * torch.exp(ls - torch.logaddexp(ls, lb)).unsqueeze(-1)
            + ob * torch.exp(lb - torch.logaddexp(ls, lb)).unsqueeze(-1),
            torch.logaddexp(ls, lb),
        ),
        "NaN",
    ),
    "float64 everywhere": (
        lambda o, ls, ob, lb: tuple(t.double() for t in merge(o, ls, ob, lb)),
        "dtype",
    ),
    "unstable lse (overflow)": (
        lambda o, ls, ob, lb: (merge(o, ls, ob, lb)[0], torch.log(torch.exp(ls) + torch.exp(lb))),
        "differs at",
    ),
}


def _in_place(o, lse, o_blk, lse_blk):
    new_o, new_l = merge(o, lse, o_blk, lse_blk)
    o.copy_(new_o)
    lse.copy_(new_l)
    return o.clone(), lse.clone()


MERGE_MISTAKES["in place"] = (_in_place, "in place")


def _crash(o, lse, o_blk, lse_blk):
    return o[lse.shape[-1] + 5], lse


MERGE_MISTAKES["crash"] = (_crash, "raised IndexError")


def test_right_merge_passes(capsys):
    check_merge(merge)
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize("name", list(MERGE_MISTAKES))
def test_each_merge_mistake_is_named(name):
    fn, words = MERGE_MISTAKES[name]
    with pytest.raises(CheckFailed, match=words):
        check_merge(fn)


def _masked(q, k, v, qp, kp, scale, seen):
    scores = (q @ k.transpose(-2, -1)) * scale
    scores = scores.masked_fill(~seen, NEG)
    lse = torch.logsumexp(scores, -1)
    return torch.exp(scores - _safe(lse).unsqueeze(-1)) @ v, lse


BLOCK_MISTAKES = {
    "local indices": (
        lambda q, k, v, qp, kp, sc: block_attention(
            q, k, v, torch.arange(len(qp)), torch.arange(len(kp)), sc
        ),
        "LOCAL indices",
    ),
    "strict mask": (
        lambda q, k, v, qp, kp, sc: _masked(q, k, v, qp, kp, sc, kp[None, :] < qp[:, None]),
        "diagonal",
    ),
    "anti-causal": (
        lambda q, k, v, qp, kp, sc: _masked(q, k, v, qp, kp, sc, kp[None, :] >= qp[:, None]),
        "wrong way round",
    ),
    "no mask": (
        lambda q, k, v, qp, kp, sc: _masked(q, k, v, qp, kp, sc, torch.ones(len(qp), len(kp)) > 0),
        "no causal mask",
    ),
    "no scale": (lambda q, k, v, qp, kp, sc: block_attention(q, k, v, qp, kp, 1.0), "no 1/√d"),
    "1/d": (lambda q, k, v, qp, kp, sc: block_attention(q, k, v, qp, kp, sc * sc), "1/d"),
    "NaN rows": (
        lambda q, k, v, qp, kp, sc: (
            torch.softmax(
                ((q @ k.transpose(-2, -1)) * sc).masked_fill(kp[None, :] > qp[:, None], NEG), -1
            )
            @ v,
            block_attention(q, k, v, qp, kp, sc)[1],
        ),
        "NaN",
    ),
    "lse is the max": (
        lambda q, k, v, qp, kp, sc: (
            block_attention(q, k, v, qp, kp, sc)[0],
            ((q @ k.transpose(-2, -1)) * sc)
            .masked_fill(kp[None, :] > qp[:, None], NEG)
            .max(-1)
            .values,
        ),
        "row MAX",
    ),
    "returns o only": (lambda q, k, v, qp, kp, sc: block_attention(q, k, v, qp, kp, sc)[0], "pair"),
}


def test_right_block_attention_passes(capsys):
    check_block_attention(block_attention)
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize("name", list(BLOCK_MISTAKES))
def test_each_block_mistake_is_named(name):
    fn, words = BLOCK_MISTAKES[name]
    with pytest.raises(CheckFailed, match=words):
        check_block_attention(fn)


def test_catalogues_have_at_least_eight():
    assert len(MERGE_MISTAKES) >= 8 and len(BLOCK_MISTAKES) >= 8
