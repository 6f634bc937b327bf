"""Lesson 19's FP8 checker: right answers, written several ways, pass; each catalogued mistake
is named."""

import pytest
import torch
import torch.nn.functional as F

from minidist.course.check import Mistake, catalogue_messages, names_mistake
from minidist.deepseek.check.fp8_scales import check_tile_scales
from minidist.deepseek.fp8 import quantize

E4M3 = torch.float8_e4m3fn


def _lesson(x):
    q = quantize(x, (1, 128))
    return q.data, q.scale


def _padded(x, pad_value=0.0, crop=True):
    rows, cols = x.shape
    tiles = -(-cols // 128)
    xp = F.pad(x.float(), (0, tiles * 128 - cols), value=pad_value).view(rows, tiles, 128)
    amax = xp.abs().amax(-1)
    scale = torch.where(amax > 0, amax / 448, torch.ones_like(amax))
    values = (xp / scale[..., None]).clamp(-448, 448).to(E4M3).view(rows, -1)
    return (values[:, :cols] if crop else values), scale


def _loop(x):
    scales, values = [], []
    for tile in x.float().split(128, dim=1):
        amax = tile.abs().amax(1, keepdim=True).clamp_min(1e-30)
        scales.append(amax / 448)
        values.append((tile * (448 / amax)).to(E4M3))
    return torch.cat(values, 1), torch.cat(scales, 1)


@pytest.mark.parametrize("answer", [_lesson, _padded, _loop], ids=["lesson", "padded", "loop"])
def test_right_quantization_passes(answer, capsys):
    check_tile_scales(answer)
    assert "PASSED" in capsys.readouterr().out


def _with(scale_of, values_of=lambda x, s: (x / s).to(E4M3)):
    """A per-tile answer with another scale rule scale_of(padded [rows, tiles, 128])."""

    def fn(x):
        rows, cols = x.shape
        tiles = -(-cols // 128)
        xp = F.pad(x.float(), (0, tiles * 128 - cols)).view(rows, tiles, 128)
        scale = scale_of(xp)
        full = scale.expand(rows, tiles).repeat_interleave(128, 1)[:, :cols]
        return values_of(x.float(), full), scale

    return fn


def _safe(s):
    return torch.where(s > 0, s, torch.ones_like(s))


def _ragged_dropped(x):
    values, scale = _lesson(x)
    return values, scale[:, : x.shape[1] // 128]


MISTAKES = [
    Mistake(
        "per tensor (one scalar)", (lambda x: (_lesson(x)[0], x.abs().max() / 448),), "whole tensor"
    ),
    Mistake(
        "per tensor, broadcast",
        (_with(lambda xp: (xp.abs().amax() / 448).expand(xp.shape[:2])),),
        "per tensor",
    ),
    Mistake(
        "per row",
        (lambda x: (_lesson(x)[0], x.float().abs().amax(1, keepdim=True) / 448),),
        "per row",
    ),
    Mistake(
        "per row, broadcast",
        (_with(lambda xp: (xp.abs().amax((1, 2)) / 448)[:, None].expand(xp.shape[:2])),),
        "per row",
    ),
    Mistake("inverted", (_with(lambda xp: _safe(448 / xp.abs().amax(-1))),), "inverted"),
    Mistake("no abs", (_with(lambda xp: _safe(xp.amax(-1) / 448)),), "abs"),
    Mistake("ragged tile dropped", (_ragged_dropped,), "dropped"),
    Mistake(
        "ragged tile padded with ones", (lambda x: _padded(x, pad_value=1.0),), "ragged last tile"
    ),
    Mistake("padding not cropped", (lambda x: _padded(x, crop=False),), "crop"),
    Mistake("zero tile NaN", (_with(lambda xp: xp.abs().amax(-1) / 448),), "all-zero tile"),
    Mistake(
        "cast without scaling",
        (lambda x: (x.float().to(E4M3), _lesson(x)[1]),),
        "without scaling",
    ),
    Mistake(
        "multiplied by the scale",
        (_with(lambda xp: _safe(xp.abs().amax(-1) / 448), lambda x, s: (x * s).to(E4M3)),),
        "divide",
    ),
    Mistake("scale = amax", (_with(lambda xp: _safe(xp.abs().amax(-1))),), "divide by E4M3"),
    Mistake(
        "values not cast", (lambda x: (_lesson(x)[0].float(), _lesson(x)[1]),), "float8_e4m3fn"
    ),
    Mistake("bf16 scales", (lambda x: (_lesson(x)[0], _lesson(x)[1].bfloat16()),), "float32"),
    Mistake("one tensor", (lambda x: _lesson(x)[0],), "pair"),
]


@pytest.fixture(scope="module")
def messages():
    return catalogue_messages(check_tile_scales, MISTAKES)


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.name)
def test_each_mistake_is_named(mistake, messages):
    assert names_mistake(mistake, messages[mistake.name]) is None
