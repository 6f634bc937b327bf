"""Exercise: FP8 quantization in 1×128 tiles (DeepSeek-V3, arXiv:2412.19437 §3.3.1).

The learner's `quantize(x)` takes x [rows, cols] (float32 or bf16) and returns (values,
scales): values x / scale in `torch.float8_e4m3fn` with x's shape, scales float32 [rows,
⌈cols / 128⌉], one per token and 128 channels (the last tile ragged), scale = amax / 448.
"""

from __future__ import annotations

import torch

from ...course.check import call_learner, fail, passed
from ..fp8 import E4M3_MAX, TILE

SHAPES = ((1, 128), (3, 200), (2, 384), (5, 1000), (4, 128), (2, 200), (1, 1000), (3, 384))


def _cases() -> list[torch.Tensor]:
    """Sampled rows 1..5 and columns 128, 200, 384, 1000, float32 and bf16, magnitudes
    10^-2..10^2; in every case a tile whose largest magnitude is negative, and an all-zero
    tile (the ragged last one where there is one) in every other case."""
    g = torch.Generator().manual_seed(19)
    out = []
    for n, (rows, cols) in enumerate(SHAPES):
        x = torch.randn(rows, cols, generator=g, device="cpu") * 10.0 ** (n % 5 - 2)
        x[0, 3] = -4 * x[0, :TILE].abs().max()  # the largest magnitude of tile 0 is negative
        if n % 2:
            x[-1, (cols - 1) // TILE * TILE :] = 0  # the last tile of the last row
        out.append(x.to(torch.bfloat16 if n % 3 == 1 else torch.float32))
    return out


def _tiles(x: torch.Tensor) -> int:
    return -(-x.shape[1] // TILE)


def _per_tile(x: torch.Tensor, reduce) -> torch.Tensor:
    """reduce(tile) for every 1×128 tile of x (float32), [rows, tiles]."""
    xf = x.float()
    return torch.stack([reduce(t) for t in xf.split(TILE, dim=1)], dim=1)


def _amax(x):
    return _per_tile(x, lambda t: t.abs().amax(1))


def _safe(scale):
    return torch.where(scale > 0, scale, torch.ones_like(scale))


# scale mistakes: name -> the scales they give, [rows, tiles] (broadcast where one per tensor)
SCALES = {
    "scale = 448 / amax is inverted: the scale maps FP8 back to x, so scale = amax / 448 and "
    "values = x / scale": lambda x: E4M3_MAX / _amax(x),
    "amax without abs(): a tile whose largest magnitude is negative gets too small a scale "
    "(or a negative one); amax = x_tile.abs().max()": lambda x: (
        _per_tile(x, lambda t: t.amax(1)) / E4M3_MAX
    ),
    "one scale per tensor: DeepSeek-V3 scales per 1×128 tile (per token, per 128 channels), "
    "so that one outlier spoils only its tile": lambda x: (x.float().abs().max() / E4M3_MAX).expand(
        x.shape[0], _tiles(x)
    ),
    "one scale per row (per token over all channels): a scale per 128 channels of each row, "
    "[rows, ⌈cols / 128⌉]": lambda x: (x.float().abs().amax(1, keepdim=True) / E4M3_MAX).expand(
        x.shape[0], _tiles(x)
    ),
    "scale = amax: divide by E4M3's largest value, scale = amax / 448, so that the tile's "
    "largest magnitude becomes 448": lambda x: _amax(x),
}


def _close(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    return (got.float() - want).abs() <= 1e-6 * want.abs()


def _check_form(out, x: torch.Tensor, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = x.shape
    tiles = _tiles(x)
    if not (isinstance(out, tuple | list) and len(out) == 2):
        fail(f"{what} must return a pair (values, scales); got {type(out).__name__}.")
    values, scales = out
    if not isinstance(values, torch.Tensor) or not isinstance(scales, torch.Tensor):
        fail(
            f"{what}: values and scales must be tensors; got {type(values).__name__}, "
            f"{type(scales).__name__}."
        )
    if values.dtype != torch.float8_e4m3fn:
        fail(
            f"{what}: values are {values.dtype}; cast x / scale to torch.float8_e4m3fn "
            "(.to(torch.float8_e4m3fn)): that cast is the FP8 rounding."
        )
    if tuple(values.shape) != (rows, cols):
        if tuple(values.shape) == (rows, tiles * TILE):
            fail(
                f"{what}: values have shape {tuple(values.shape)}: the padding of the ragged "
                f"last tile was returned; crop it, values have x's shape ({rows}, {cols})."
            )
        fail(f"{what}: values have shape {tuple(values.shape)}, want x's ({rows}, {cols}).")
    shape = tuple(scales.shape)
    if shape != (rows, tiles):
        kept = cols // TILE
        if cols % TILE and shape[:1] == (rows,) and scales.numel() == rows * kept:
            full = _safe(_amax(x)[:, :kept] / E4M3_MAX)
            if _close(scales.reshape(rows, kept), full).all():
                fail(
                    f"{what}: scales {shape}: the ragged last tile ({cols % TILE} columns) was "
                    f"dropped; ⌈{cols} / 128⌉ = {tiles} tiles per row, the last one shorter."
                )
        if scales.numel() == 1:
            fail(
                f"{what}: one scale for the whole tensor; DeepSeek-V3 scales per 1×128 tile "
                f"(per token, per 128 channels): scales [{rows}, {tiles}]."
            )
        if shape in ((rows,), (rows, 1)):
            fail(
                f"{what}: one scale per row (per token over all {cols} channels); a scale per "
                f"128 channels of each row: scales [{rows}, {tiles}]."
            )
        fail(f"{what}: scales have shape {shape}, want [rows, ⌈cols / 128⌉] = [{rows}, {tiles}].")
    if scales.dtype != torch.float32:
        fail(
            f"{what}: scales are {scales.dtype}; keep them in float32 (the paper's scales "
            "are FP32, one multiply per tile when the GEMM's result is promoted)."
        )
    return values, scales


def _check_scales(x: torch.Tensor, scales: torch.Tensor, what: str) -> None:
    amax = _amax(x)
    zero = amax == 0
    if not torch.isfinite(scales).all() or (scales[zero] <= 0).any():
        fail(
            f"{what}: an all-zero tile got scale {scales[zero].tolist()}: its amax is 0, so "
            "amax / 448 = 0 and 0 / 0 = NaN; give such a tile scale 1 (torch.where(amax > 0, "
            "amax / 448, 1))."
        )
    want = _safe(amax / E4M3_MAX)
    if _close(scales, want)[~zero].all():
        return
    for name, predict in SCALES.items():
        if _close(scales, predict(x))[~zero].all():
            fail(f"{what}: {name}.")
    bad = ~_close(scales, want) & ~zero
    last = torch.zeros_like(bad)
    last[:, -1] = True
    if x.shape[1] % TILE and (bad <= last).all():
        fail(
            f"{what}: only the ragged last tile's scale is wrong ({x.shape[1] % TILE} columns): "
            "take its amax over its real values (pad with zeros, not ones or copies)."
        )
    row, tile = (int(i) for i in bad.nonzero()[0])
    fail(
        f"{what}: row {row}, tile {tile} (columns {tile * TILE}..): scale "
        f"{float(scales[row, tile]):.6g}, want amax / 448 = {float(want[row, tile]):.6g}."
    )


def _check_values(x: torch.Tensor, values: torch.Tensor, scales: torch.Tensor, what: str):
    want = x.float() / scales.float().repeat_interleave(TILE, 1)[:, : x.shape[1]]
    got = values.float()
    # one E4M3 rounding: half an ulp, 2^-4 relative for a normal, 2^-10 for a subnormal
    ok = (got - want).abs() <= 2.0**-4 * want.abs() + 2.0**-10 + 1e-6 * want.abs()
    if ok.all():
        return
    if torch.equal(values.float().nan_to_num(), x.float().to(values.dtype).float().nan_to_num()):
        fail(
            f"{what}: the values are x cast to FP8 without scaling: values = (x / scale) "
            "cast, so that each tile's largest magnitude is 448."
        )
    scaled = x.float() * scales.float().repeat_interleave(TILE, 1)[:, : x.shape[1]]
    if torch.equal(values.float().nan_to_num(), scaled.to(values.dtype).float().nan_to_num()):
        fail(f"{what}: values = x · scale; divide: values = x / scale (scale = amax / 448).")
    if got.isnan().any():
        fail(
            f"{what}: NaN values: E4M3 has no infinity, a value over 448 (464 and more) "
            "becomes NaN; x / (amax / 448) stays within ±448."
        )
    row, col = (int(i) for i in (~ok).nonzero()[0])
    fail(
        f"{what}: values[{row}, {col}] = {float(got[row, col]):.6g}, want x / scale = "
        f"{float(want[row, col]):.6g} rounded to E4M3."
    )


def check_tile_scales(quantize_tiles) -> None:
    """The learner's 1×128 tile quantization on sampled shapes and dtypes: the form, the
    scales, then the values (to one E4M3 rounding)."""
    cases = _cases()
    for x in cases:
        what = f"quantize(x [{x.shape[0]}, {x.shape[1]}] {x.dtype})"
        given = x.clone()
        out = call_learner(quantize_tiles, given, what=what)
        if not torch.equal(given, x):
            fail(f"{what}: your code changed x in place; compute new tensors.")
        values, scales = _check_form(out, x, what)
        _check_scales(x, scales.detach(), what)
        _check_values(x, values.detach(), scales.detach(), what)
    passed(
        f"1×128 tile quantization on {len(cases)} shapes (rows 1-5, columns 128-1000, ragged "
        "last tiles, all-zero tiles), float32 and bf16"
    )
