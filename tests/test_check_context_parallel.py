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
        "overflows",
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


def _unshifted(o, lse, o_blk, lse_blk):
    e1, e2 = torch.exp(lse).unsqueeze(-1), torch.exp(lse_blk).unsqueeze(-1)
    return torch.nan_to_num((o * e1 + o_blk * e2) / (e1 + e2)), torch.logaddexp(lse, lse_blk)


def _zero_empty(o, lse, o_blk, lse_blk):
    new_o, new_l = merge(o, lse, o_blk, lse_blk)
    return new_o, new_l.masked_fill(new_l == NEG, 0.0)


def _no_unsqueeze(o, lse, o_blk, lse_blk):
    new = torch.logaddexp(lse, lse_blk)
    return o * torch.exp(lse - new) + o_blk * torch.exp(lse_blk - new), new


MORE_MERGE_MISTAKES = {
    "e^lse unshifted": (_unshifted, "overflows"),
    "lse' = 0 on empty rows": (_zero_empty, "keep lse' = -inf"),
    "no unsqueeze(-1)": (_no_unsqueeze, "unsqueeze"),
}


@pytest.mark.parametrize("name", list(MORE_MERGE_MISTAKES))
def test_more_merge_mistakes_found_by_a_fresh_learner_are_named(name):
    fn, words = MORE_MERGE_MISTAKES[name]
    with pytest.raises(CheckFailed, match=words):
        check_merge(fn)


def _fill(value):
    def fn(q, k, v, qp, kp, sc):
        return _masked_fill(q, k, v, qp, kp, sc, value)

    return fn


def _masked_fill(q, k, v, qp, kp, sc, value):
    s = ((q @ k.transpose(-2, -1)) * sc).masked_fill(kp[None, :] > qp[:, None], value)
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - lse.unsqueeze(-1)) @ v, lse


def _in_place_q(q, k, v, qp, kp, sc):
    q.mul_(sc)
    return block_attention(q, k, v, qp, kp, 1.0)


def _lse_before_mask(q, k, v, qp, kp, sc):
    o, _ = block_attention(q, k, v, qp, kp, sc)
    return o, torch.logsumexp((q @ k.transpose(-2, -1)) * sc, -1)


def _unnormalised(q, k, v, qp, kp, sc):
    s = ((q @ k.transpose(-2, -1)) * sc).masked_fill(kp[None, :] > qp[:, None], NEG)
    return torch.exp(s) @ v, torch.logsumexp(s, -1)


MORE_BLOCK_MISTAKES = {
    "float32 out": (
        lambda q, k, v, qp, kp, sc: tuple(t.float() for t in block_attention(q, k, v, qp, kp, sc)),
        "keep the inputs' dtype",
    ),
    "keepdim lse": (
        lambda q, k, v, qp, kp, sc: (
            block_attention(q, k, v, qp, kp, sc)[0],
            block_attention(q, k, v, qp, kp, sc)[1].unsqueeze(-1),
        ),
        "no keepdim",
    ),
    "in-place q": (_in_place_q, "in place"),
    "-1e9 fill": (_fill(-1e9), "large negative number"),
    "0 fill": (_fill(0.0), "set to 0"),
    "unnormalised": (_unnormalised, "not normalised"),
    "lse before mask": (_lse_before_mask, "before the mask"),
    "divided by the scale": (
        lambda q, k, v, qp, kp, sc: block_attention(q, k, v, qp, kp, 1 / sc),
        "division by the scale",
    ),
}


@pytest.mark.parametrize("name", list(MORE_BLOCK_MISTAKES))
def test_more_block_mistakes_found_by_a_fresh_learner_are_named(name):
    fn, words = MORE_BLOCK_MISTAKES[name]
    with pytest.raises(CheckFailed, match=words):
        check_block_attention(fn)


def _zero_o_is_empty(o, lse, o_blk, lse_blk):
    empty = (o == 0).all(-1)  # wrong: an attention can be 0 after keys; empty is lse = -inf
    new_o, new_l = merge(o, lse, o_blk, lse_blk)
    return (
        torch.where(empty.unsqueeze(-1), o_blk, new_o),
        torch.where(empty, lse_blk, new_l),
    )


WRONG_FORMS = {
    "(lse, o) swapped": (lambda *a: merge(*a)[::-1], r"came back as \(lse, o\)"),
    "a triple": (lambda *a: (*merge(*a), None), "a tuple of 3"),
    "None": (lambda *a: None, "NoneType"),
    "numpy o": (lambda *a: (merge(*a)[0].numpy(), merge(*a)[1]), "numpy.ndarray, not a torch"),
    "o = 0 taken as empty": (_zero_o_is_empty, "all zeros was taken as"),
}


@pytest.mark.parametrize("name", list(WRONG_FORMS))
def test_wrong_forms_of_the_merge_are_named_not_crashes(name):
    fn, words = WRONG_FORMS[name]
    with pytest.raises(CheckFailed, match=words):
        check_merge(fn)


def _no_max(q, k, v, qp, kp, sc):
    s = ((q @ k.transpose(-2, -1)) * sc).masked_fill(kp[None, :] > qp[:, None], NEG)
    e = torch.exp(s)  # no max subtracted: e^900 is inf in float64
    total = e.sum(-1)
    tiny = torch.finfo(total.dtype).tiny
    return (e @ v) / total.clamp_min(tiny).unsqueeze(-1), torch.log(total)


BLOCK_FORMS = {
    "exp without the max": (_no_max, "overflows"),
    "(lse, o) swapped": (lambda *a: block_attention(*a)[::-1], r"came back as \(lse, o\)"),
    "a triple": (lambda *a: (*block_attention(*a), None), "a tuple of 3"),
    "None": (lambda *a: None, "NoneType"),
    "numpy lse": (
        lambda *a: (block_attention(*a)[0], block_attention(*a)[1].numpy()),
        "numpy.ndarray, not a torch",
    ),
    "float32 always": (
        lambda q, k, v, qp, kp, sc: block_attention(q.float(), k.float(), v.float(), qp, kp, sc),
        "keep the inputs' dtype",
    ),
}


@pytest.mark.parametrize("name", list(BLOCK_FORMS))
def test_wrong_forms_of_block_attention_are_named_not_crashes(name):
    fn, words = BLOCK_FORMS[name]
    with pytest.raises(CheckFailed, match=words):
        check_block_attention(fn)


def test_a_diagnosis_that_raises_falls_back_to_a_message(monkeypatch):
    from minidist.context_parallel.check import merge as merge_check

    def broken(*args):
        raise RuntimeError("a case the diagnosis did not foresee")

    monkeypatch.setattr(merge_check, "_merge_diagnosis", broken)
    with pytest.raises(CheckFailed, match="could not say more precisely"):
        check_merge(lambda *a: (merge(*a)[0] * 2, merge(*a)[1]))


def _merge_by_max(o, lse, o_blk, lse_blk):
    m = torch.maximum(lse, lse_blk)
    m = m.masked_fill(m == NEG, 0.0)
    w, w_blk = torch.exp(lse - m), torch.exp(lse_blk - m)
    total = w + w_blk
    safe = total.masked_fill(total == 0, 1.0)
    out = (o * w.unsqueeze(-1) + o_blk * w_blk.unsqueeze(-1)) / safe.unsqueeze(-1)
    return out, m + torch.log(total)


def _block_by_softmax(q, k, v, qp, kp, sc):
    s = ((q @ k.transpose(-2, -1)) * sc).masked_fill(kp[None, :] > qp[:, None], NEG)
    return torch.softmax(s, -1).nan_to_num(0.0) @ v, torch.logsumexp(s, -1)


def test_right_answers_written_otherwise_pass(capsys):
    check_merge(_merge_by_max)
    check_block_attention(_block_by_softmax)
    assert capsys.readouterr().out.count("PASSED") == 2
