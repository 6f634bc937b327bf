"""Lesson 14's checkers: the right answers pass; each catalogued mistake is named."""

import math

import numpy as np
import pytest
import torch
import torch.distributed as dist

from minidist import comm
from minidist.course.check import CheckFailed, Mistake, catalogue_messages, names_mistake
from minidist.sequence_parallel.check import (
    ACT_MISTAKES,
    check_reduce_scatter_to_sequence,
    check_sp_activation_bytes,
)


def _blocks(x, group):
    n = dist.get_world_size(group)
    return torch.cat([p.contiguous().reshape(-1) for p in x.chunk(n, dim=1)])


def _gather(grad, group):
    n = dist.get_world_size(group)
    grad = grad.contiguous()
    out = torch.empty(n * grad.numel(), dtype=grad.dtype)
    comm.all_gather(out, grad.reshape(-1), group=group)
    return torch.cat(out.view(n, *grad.shape).unbind(0), dim=1)


def _reduce_scatter(x, group, flat=None):
    n = dist.get_world_size(group)
    b, s, h = x.shape
    flat = _blocks(x, group) if flat is None else flat
    out = torch.empty(b * (s // n) * h, dtype=x.dtype)
    comm.reduce_scatter(out, flat, group=group)
    return out.view(b, s // n, h)


class Right(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, ctx.group), None


def _variant(forward=None, backward=None):
    class Wrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, group):
            ctx.group = group
            return (forward or (lambda x, g: _reduce_scatter(x, g)))(x, group)

        @staticmethod
        def backward(ctx, grad):
            return (backward or (lambda g, grp: _gather(g, grp)))(grad, ctx.group), None

    return Wrong


def _all_reduce(x, g):
    out = x.clone()
    comm.all_reduce(out, group=g)
    return out


def _hidden_split(x, g):
    out = x.clone()
    comm.all_reduce(out, group=g)
    return out.chunk(dist.get_world_size(g), dim=2)[dist.get_rank(g)]


def _mean(x, g):
    return _reduce_scatter(x, g) / dist.get_world_size(g)


def _world(x, g):
    return _reduce_scatter(x, None)[:, : x.shape[1] // dist.get_world_size(g)]


def _world_sum(x, g):
    n, r = dist.get_world_size(g), dist.get_rank(g)
    return _all_reduce(x, None).chunk(n, dim=1)[r].contiguous()


def _reversed(x, g):
    n = dist.get_world_size(g)
    flipped = torch.cat(x.chunk(n, dim=1)[::-1], dim=1)
    return _reduce_scatter(flipped, g)


def _flat(x, g):
    return _reduce_scatter(x, g, flat=x.contiguous().reshape(-1))


def _storage(x, g):
    n = dist.get_world_size(g)
    b, s, h = x.shape
    raw = torch.as_strided(x, (x.numel(),), (1,)).clone()  # the memory, in storage order
    out = torch.empty(raw.numel() // n, dtype=x.dtype)
    comm.reduce_scatter(out, raw, group=g)
    return out.view(b, s // n, h)


def _direct(x, g):
    n = dist.get_world_size(g)
    b, s, h = x.shape
    out = torch.empty(b * (s // n) * h, dtype=x.dtype)
    dist.reduce_scatter_tensor(out, _blocks(x, g), group=g)  # invisible to the ledger
    return out.view(b, s // n, h)


def _own_block(g_, grp):
    n, r = dist.get_world_size(grp), dist.get_rank(grp)
    out = torch.zeros(g_.shape[0], g_.shape[1] * n, g_.shape[2], dtype=g_.dtype)
    out[:, r * g_.shape[1] : (r + 1) * g_.shape[1]] = g_
    return out


def _repeat(g_, grp):
    return torch.cat([g_] * dist.get_world_size(grp), dim=1)


def _fp32(x, g):
    return _reduce_scatter(x.float(), g)


def _in_place(x, g):
    x.mul_(1.0).add_(0.0)  # a learner's in-place edit of the input
    x.data.add_(1.0)
    out = _reduce_scatter(x.detach() - 1.0, g)
    return out.requires_grad_()


SP_CATALOGUE = {
    "all-reduce instead of reduce-scatter": (_variant(_all_reduce), "that is an all-reduce"),
    "split the hidden dimension": (_variant(_hidden_split), "you split the hidden"),
    "mean instead of sum": (_variant(_mean), "MEAN"),
    "split over the world, not the tp group": (_variant(_world), "pass group=group"),
    "all-reduce then keep a block": (_variant(_world_sum), r"forward made \[.all_reduce.\]"),
    "blocks in reverse order": (_variant(_reversed), "keeps block"),
    "flattened [b, s, h] without splitting the sequence": (_variant(_flat), "split the BATCH"),
    "read the transposed input's storage": (_variant(_storage), "storage"),
    "called torch.distributed directly": (_variant(_direct), "invisible"),
    "backward is the identity": (_variant(backward=lambda g_, grp: g_), r"not x's \[b, s, h\]"),
    "backward zero-padded its own block": (_variant(backward=_own_block), "zeros elsewhere"),
    "backward repeated its own block": (_variant(backward=_repeat), "repeated"),
    "returned float32 for a float64 input": (_variant(_fp32), "keep x's dtype"),
}


def _skip_zero_grad(g_, grp):
    if not g_.any():  # "nothing to gather": the other ranks wait in their all-gather
        n = dist.get_world_size(grp)
        return torch.zeros(g_.shape[0], g_.shape[1] * n, g_.shape[2], dtype=g_.dtype)
    return _gather(g_, grp)


def _skip_zero_x(x, g):
    if not x.any():  # "nothing to add": the other ranks wait in their reduce-scatter
        n = dist.get_world_size(g)
        b, s, h = x.shape
        return torch.zeros(b, s // n, h, dtype=x.dtype, requires_grad=True)
    return _reduce_scatter(x, g)


def _world_gather(g_, grp):
    n = dist.get_world_size()  # the world, not the tp group
    g_ = g_.contiguous()
    out = torch.empty(n * g_.numel(), dtype=g_.dtype)
    comm.all_gather(out, g_.reshape(-1))
    return torch.cat(out.view(n, *g_.shape).unbind(0), dim=1)


def _no_group_gather(g_, grp):
    n = dist.get_world_size(grp)
    g_ = g_.contiguous()
    out = torch.empty(n * g_.numel(), dtype=g_.dtype)
    comm.all_gather(out, g_.reshape(-1))  # group= forgotten: the world
    return torch.cat(out.view(n, *g_.shape).unbind(0), dim=1)


def _backward_returns(fn):
    class Wrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, group):
            ctx.group = group
            return _reduce_scatter(x, group)

        @staticmethod
        def backward(ctx, grad):
            return fn(_gather(grad, ctx.group))

    return Wrong


SP_MISTAKES = [Mistake(name, (cls,), words) for name, (cls, words) in SP_CATALOGUE.items()] + [
    Mistake(
        "backward skips its all-gather for a zero block",
        (_variant(backward=_skip_zero_grad),),
        r"same collectives.*ALL ZEROS",
        alone=True,
    ),
    Mistake(
        "forward skips its reduce-scatter for a zero input",
        (_variant(_skip_zero_x),),
        r"still waiting.*ALL ZEROS",
        alone=True,
    ),
    Mistake(
        "backward gathers over the world",
        (_variant(backward=_world_gather),),
        r"one per rank of the WORLD\. Wrong group",
        alone=True,
    ),
    Mistake(
        "backward's all-gather without group=",
        (_variant(backward=_no_group_gather),),
        "ran over the whole world of 4 ranks. Wrong group",
        alone=True,
    ),
    Mistake(
        "backward returns (None, grad)",
        (_backward_returns(lambda g_: (None, g_)),),
        r"return \(grad_x, None\)",
        alone=True,
    ),
    Mistake(
        "backward returns numpy",
        (_backward_returns(lambda g_: (g_.numpy(), None)),),
        "a numpy.ndarray for x's gradient",
        alone=True,
    ),
    Mistake(
        "forward returns (y, None)",
        (_variant(lambda x, g: (_reduce_scatter(x, g), None)),),
        "forward returned a tuple",
    ),
    Mistake("forward returns None", (_variant(lambda x, g: None),), "forward returned a NoneType"),
    Mistake(
        "forward returns numpy",
        (_variant(lambda x, g: _reduce_scatter(x, g).detach().numpy()),),
        "forward returned a numpy.ndarray",
    ),
]


@pytest.fixture(scope="module")
def sp_messages():
    return catalogue_messages(check_reduce_scatter_to_sequence, SP_MISTAKES + FRESH_MISTAKES)


def test_right_answer_passes(capsys):
    check_reduce_scatter_to_sequence(Right)
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize("mistake", SP_MISTAKES, ids=lambda m: m.name)
def test_each_reduce_scatter_mistake_is_named(mistake, sp_messages):
    assert names_mistake(mistake, sp_messages[mistake.name]) is None


def test_sp_catalogue_is_at_least_eight():
    assert len(SP_MISTAKES) >= 8 and len(ACT_MISTAKES) >= 8


def test_activation_formula_right_answer_passes(capsys):
    check_sp_activation_bytes(lambda s, b, h, a, t: s * b * h * (34 / t + 5 * a * s / (h * t)))
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize("name", list(ACT_MISTAKES))
def test_each_activation_formula_mistake_is_named(name):
    with pytest.raises(CheckFailed, match="known mistake"):
        check_sp_activation_bytes(ACT_MISTAKES[name])


def test_an_unknown_formula_gets_where_and_how_much():
    with pytest.raises(CheckFailed, match=r"for s=.*x\).*layers differ"):
        check_sp_activation_bytes(lambda s, b, h, a, t: 3.0 * s)


def test_a_crashing_formula_is_a_message():
    with pytest.raises(CheckFailed, match="ZeroDivisionError"):
        check_sp_activation_bytes(lambda s, b, h, a, t: 1 / (t - 1))


def _shaped_output(x, g):
    n = dist.get_world_size(g)
    b, s, h = x.shape
    out = torch.empty(b, s // n, h, dtype=x.dtype)  # shaped, not flat: gloo refuses it
    comm.reduce_scatter(out, _blocks(x, g), group=g)
    return out


def _float32_buffer(x, g):
    n = dist.get_world_size(g)
    b, s, h = x.shape
    out = torch.empty(b * (s // n) * h, dtype=torch.float32)
    comm.reduce_scatter(out, _blocks(x, g), group=g)
    return out.view(b, s // n, h).to(x.dtype)


def _hang(x, g):
    if dist.get_rank(g) == 0:
        return _reduce_scatter(x, g)
    return _reduce_scatter(x, g) if False else x[:, : x.shape[1] // dist.get_world_size(g)] * 0


FRESH_MISTAKES = [
    Mistake("shaped output buffer", (_variant(_shaped_output),), "buffers do not fit", alone=True),
    Mistake(
        "float32 buffer for float64",
        (_variant(_float32_buffer),),
        "different dtypes",
        alone=True,
    ),
    Mistake(
        "collective on rank 0 only",
        (_variant(_hang),),
        r"still waiting|same collectives",
        alone=True,
    ),
]


@pytest.mark.parametrize("mistake", FRESH_MISTAKES, ids=lambda m: m.name)
def test_what_a_fresh_learner_tried_is_named(mistake, sp_messages):
    assert names_mistake(mistake, sp_messages[mistake.name]) is None
    assert "rank None" not in sp_messages[mistake.name]


def _floor_total(s, b, h, a, t):
    return math.floor((34 * s * b * h + 5 * a * s * s * b) / t)


def _int_total(s, b, h, a, t):
    return int((34 * s * b * h + 5 * a * s * s * b) / t)


@pytest.mark.parametrize(
    "fn, words",
    [
        (lambda s, b, h, a, t: (34 * s * b * h + 5 * a * s * s * b) // t, "known mistake"),
        (lambda s, b, h, a, t: (34 * s * b * h + 5 * a * s * b) / t, "s × s per head"),
        (lambda s, b, h, a, t: (34 * s * b * h + 5 * h * s * s * b) / t, "heads"),
        (lambda s, b, h, a, t: None, "return the number of bytes"),
        (_floor_total, r"rounded down to a whole number of bytes \(math.floor\)"),
        (_int_total, r"^(?![\s\S]*//)[\s\S]*rounded down.*\(int\(\)\)"),
        (
            lambda s, b, h, a, t: s * b * h * (24 / t + 5 * a * s / (h * t)),
            r"24·s·b·h/t where the paper has 34·s·b·h/t",
        ),
        (
            lambda s, b, h, a, t: s * b * h * (34 / t + 3 * a * s / (h * t)),
            r"3·a·s²·b/t where the paper has 5·a·s²·b/t \(0.6x\)",
        ),
        (
            lambda s, b, h, a, t: s * b * h * (34 / t + 5 * a * s / h) * 2,
            r"68·s·b·h/t where the paper has 34.*a term 10·a·s²·b",
        ),
        (lambda s, b, h, a, t: "12 GiB", "return the number of bytes"),
        (
            lambda s, b, h, a, t: torch.tensor(s * b * h * (34 / t + 5 * a * s / (h * t))),
            "computed in float32",
        ),
    ],
)
def test_formula_mistakes_a_fresh_learner_made_are_named(fn, words):
    with pytest.raises(CheckFailed, match=words):
        check_sp_activation_bytes(fn)


@pytest.mark.parametrize(
    "fn",
    [
        lambda s, b, h, a, t: np.float64(s * b * h * (34 / t + 5 * a * s / (h * t))),
        lambda s, b, h, a, t: torch.tensor(34 * s * b * h + 5 * a * s * s * b + 0.0).double() / t,
        lambda s, b, h, a, t: (34 * s * b * h + 5 * a * s * s * b) / t,
    ],
)
def test_right_formulas_written_otherwise_pass(fn, capsys):
    check_sp_activation_bytes(fn)
    assert "PASSED" in capsys.readouterr().out
