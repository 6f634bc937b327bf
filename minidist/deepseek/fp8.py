"""FP8 training as DeepSeek-V3 does it, simulated exactly on a CPU (arXiv:2412.19437 §3.3).

E4M3 values come from torch's `float8_e4m3fn` (round to nearest even, max 448): activations
and gradients scaled per 1×128 tile, weights per 128×128 block, each with a float32 scale
amax/448 (§3.3.1). A GEMM multiplies the FP8 values exactly (4-bit significands), sums each
N_C = 128 slice of the inner dimension in a simulated tensor-core accumulator that keeps
`accumulator_bits` significant bits and truncates after every addition, then scales the
slice's sum by its two scales and adds it to a float32 accumulator (§3.3.2, promotion to
CUDA cores). `convert_to_fp8_training` swaps a model's nn.Linear for one whose Fprop, Dgrad
and Wgrad run through that GEMM (Figure 6).

What is simulated: the E4M3 rounding, the scales, the ragged tiles, the truncation of the
accumulator, the promotion interval. What is not: the real tensor core's alignment rule
(unpublished; "about 14 bits" is modelled as a floating-point sum truncated to 14 bits),
the speed, the memory (activations are kept in their own dtype for Wgrad, not cached in
FP8), E5M2, low-precision communication and the power-of-two scales of §3.3.3.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
TILE = 128  # the paper's tile width and promotion interval N_C
ACTIVATION_TILE = (1, TILE)  # one token, 128 channels
WEIGHT_BLOCK = (TILE, TILE)  # 128 output × 128 input channels
ACCUMULATOR_BITS = 14  # H800's FP8 GEMM "retains around 14 bits" (§3.3.2)


@dataclass
class Fp8Tensor:
    """E4M3 values of a [rows, cols] tensor and one float32 scale per `block` (the last
    blocks of each dimension ragged): value ≈ data · scale."""

    data: torch.Tensor
    scale: torch.Tensor
    block: tuple[int, int]

    def t(self) -> Fp8Tensor:
        return Fp8Tensor(self.data.t(), self.scale.t(), (self.block[1], self.block[0]))

    def expanded_scale(self) -> torch.Tensor:
        """The scale of every element, [rows, cols]."""
        return _expand(self.scale, self.block, self.data.shape)

    def dequantize(self) -> torch.Tensor:
        return self.data.float() * self.expanded_scale()


def _expand(scale: torch.Tensor, block: tuple[int, int], shape) -> torch.Tensor:
    s = scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
    return s[: shape[0], : shape[1]]


def quantize(x: torch.Tensor, block: tuple[int, int] | None = ACTIVATION_TILE) -> Fp8Tensor:
    """x [rows, cols] in E4M3, one scale amax/448 per `block` (None: one for the tensor).
    A block of zeros gets scale 1 (its values stay 0, no 0/0)."""
    if x.dim() != 2:
        raise ValueError(f"quantize: x must be 2-D [rows, cols], got shape {tuple(x.shape)}")
    rows, cols = x.shape
    br, bc = block or (max(rows, 1), max(cols, 1))
    nr, nc = -(-rows // br), -(-cols // bc)
    x = x.float()
    padded = F.pad(x, (0, nc * bc - cols, 0, nr * br - rows))  # zeros never raise an amax
    amax = padded.abs().reshape(nr, br, nc, bc).amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    # amax / (amax / 448) may land an ulp above 448, which E4M3 (no infinity) would make NaN
    scaled = (x / _expand(scale, (br, bc), x.shape)).clamp(-E4M3_MAX, E4M3_MAX)
    return Fp8Tensor(scaled.to(E4M3), scale, (br, bc))


def round_to_bits(x: torch.Tensor, bits: int) -> torch.Tensor:
    """float32 x with its significand truncated (toward zero) to `bits` bits (1 ≤ bits ≤ 24),
    as an accumulator that drops the bits shifted out when it aligns an addend."""
    keep = -(1 << (24 - bits))  # ones above the 24 - bits low bits of the significand
    return (x.float().view(torch.int32) & keep).view(torch.float32)


def _limited_sum(left: torch.Tensor, right: torch.Tensor, bits: int | None) -> torch.Tensor:
    """Σ_j left[j] · right[j] (broadcast products), added one product at a time and truncated
    to `bits` after each addition (None: one float32 sum)."""
    if bits is None:
        return (left * right).sum(0)
    acc = left[0] * right[0]
    truncate = acc.view(torch.int32)  # the same memory: truncating it truncates acc
    keep = -(1 << (24 - bits))
    for j in range(1, left.shape[0]):
        acc.addcmul_(left[j], right[j])
        truncate.bitwise_and_(keep)
    return round_to_bits(acc, bits)


def fp8_matmul(
    a: Fp8Tensor,
    b: Fp8Tensor,
    promote_every: int | None = TILE,
    accumulator_bits: int | None = ACCUMULATOR_BITS,
) -> torch.Tensor:
    """a [M, K] @ b [K, N] in float32. With promotion: each `promote_every` slice of K summed
    in the limited accumulator, times its scales, added in float32; `promote_every` must be
    a divisor of a's and b's blocks along K (the scales are constant inside a slice).
    Without (None): every scaled product added in the limited accumulator, as a tensor
    core that runs the whole K."""
    (m, k), (k2, n) = a.data.shape, b.data.shape
    if k != k2:
        raise ValueError(
            f"fp8_matmul: inner dimensions differ: a {tuple(a.data.shape)}, b {tuple(b.data.shape)}"
        )
    if promote_every is None:
        sa, sb = a.expanded_scale(), b.expanded_scale()
        av, bv = a.data.float() * sa, b.data.float() * sb
        return _limited_sum(av.t()[:, :, None], bv[:, None, :], accumulator_bits)
    if any(kb < k and kb % promote_every for kb in (a.block[1], b.block[0])):
        raise ValueError(
            f"fp8_matmul: promote_every={promote_every} must divide the blocks "
            f"along K ({a.block[1]}, {b.block[0]})"
        )
    c = -(-k // promote_every)
    pad = c * promote_every - k
    # every slice at once: [slice, M, j] and [slice, j, N]; FP8 products are exact in float32
    av = F.pad(a.data.float(), (0, pad)).reshape(m, c, promote_every).transpose(0, 1)
    bv = F.pad(b.data.float(), (0, 0, 0, pad)).reshape(c, promote_every, n)
    left = av.permute(2, 0, 1)[..., None].contiguous()  # [j, slice, M, 1]
    right = bv.transpose(0, 1)[:, :, None, :].contiguous()  # [j, slice, 1, N]
    sums = _limited_sum(left, right, accumulator_bits)
    # the scales of slice s: a's column block and b's row block holding its first element
    first = torch.arange(c, device=a.scale.device) * promote_every
    sa = a.scale[:, first // a.block[1]].repeat_interleave(a.block[0], 0)[:m].t()
    sb = b.scale[first // b.block[0], :].repeat_interleave(b.block[1], 1)[:, :n]
    out = torch.zeros(m, n, device=sums.device)
    for s in range(c):  # promotion: a float32 multiply-add on the CUDA cores
        out = out + sums[s] * sa[s, :, None] * sb[s, None, :]
    return out


@dataclass
class Fp8Config:
    """How an FP8 linear quantizes and accumulates; `output_dtype` is what Fprop's output and
    Dgrad's input gradient are rounded to (BF16 in the paper's Figure 6; Wgrad stays
    float32)."""

    activation_block: tuple[int, int] | None = ACTIVATION_TILE
    weight_block: tuple[int, int] | None = WEIGHT_BLOCK
    promote_every: int | None = TILE
    accumulator_bits: int | None = ACCUMULATOR_BITS
    output_dtype: torch.dtype = torch.bfloat16


def _gemm(a, a_block, b, b_block, cfg: Fp8Config) -> torch.Tensor:
    """a [M, K] @ b [K, N] with both quantized along K as `a_block`, `b_block` say."""
    return fp8_matmul(
        quantize(a, a_block), quantize(b, b_block), cfg.promote_every, cfg.accumulator_bits
    )


def _transposed(block):
    return None if block is None else (block[1], block[0])


class _Fp8LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, cfg: Fp8Config):
        ctx.save_for_backward(x, weight)
        ctx.cfg, ctx.has_bias = cfg, bias is not None
        x2 = x.reshape(-1, x.shape[-1])
        # Fprop: x in 1×128 tiles (per token), W^T in 128×128 blocks, both along K
        y = _gemm(x2, cfg.activation_block, weight.t(), cfg.weight_block, cfg)
        if bias is not None:
            y = y + bias.float()
        return y.to(cfg.output_dtype).to(x.dtype).reshape(*x.shape[:-1], -1)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        cfg = ctx.cfg
        dy2, x2 = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
        # Dgrad: dY in 1×128 tiles along the output channels, W in 128×128 blocks
        dx = _gemm(dy2, cfg.activation_block, weight, cfg.weight_block, cfg)
        dx = dx.to(cfg.output_dtype).to(x.dtype).reshape(x.shape)
        # Wgrad: the inner dimension is the tokens, so dY^T and X in 128×1 tiles (per channel
        # over 128 tokens, the paper's transposed tiles); the result stays float32
        token_tile = _transposed(cfg.activation_block)
        dw = _gemm(dy2.t(), cfg.activation_block, x2, token_tile, cfg).to(weight.dtype)
        db = dy2.float().sum(0).to(weight.dtype) if ctx.has_bias else None
        return dx, dw, db, None


class Fp8Linear(nn.Linear):
    """nn.Linear whose three GEMMs take FP8 inputs; its parameters stay as they are (float32
    master weights: the optimizer never sees FP8). Made by `convert_to_fp8_training`."""

    fp8_config: Fp8Config

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Fp8LinearFunction.apply(x, self.weight, self.bias, self.fp8_config)


def _high_precision(model: nn.Module) -> Callable[[nn.Module, str], bool]:
    """The paper's exceptions (§3.3): the output head and the MoE gating stay in their own
    precision (embeddings and norms are not nn.Linear, attention's core is no Linear)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None

    def keep(module: nn.Module, fqn: str) -> bool:
        return module is head or fqn.rsplit(".", 1)[-1] in ("gate", "router", "lm_head")

    return keep


def convert_to_fp8_training(
    model: nn.Module,
    config: Fp8Config | None = None,
    module_filter_fn: Callable[[nn.Module, str], bool] | None = None,
) -> nn.Module:
    """Swap, in place, the class of every nn.Linear of `model` that `module_filter_fn(module,
    fqn)` accepts (default: all but the head and routers) for `Fp8Linear`; names, parameters
    and state dict are unchanged. Returns `model`."""
    config = config or Fp8Config()
    keep = _high_precision(model)
    for fqn, module in model.named_modules():
        if type(module) is not nn.Linear or keep(module, fqn):
            continue
        if module_filter_fn is not None and not module_filter_fn(module, fqn):
            continue
        module.__class__ = Fp8Linear
        module.fp8_config = config
    return model
