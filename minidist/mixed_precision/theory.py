"""What mixed precision should do, as functions: number formats, memory and bytes, once.

- Number formats (Micikevicius et al. 2018, "Mixed Precision Training", ICLR, section 3;
  Kalamkar et al. 2019, "A Study of BFLOAT16 for Deep Learning Training", arXiv:1905.12322):
  `float_format` reads a dtype's bits, range and precision from `torch.finfo`. fp16 has 5
  exponent bits (normal numbers from 2^-14 to 65504, subnormals down to 2^-24) and 10
  mantissa bits; bf16 keeps fp32's 8 exponent bits (range to 3.4e38) with 7 mantissa bits.
  `fate` says, by casting, what becomes of measured values (gradients) in a format, with a
  loss scale: flushed to zero, subnormal (precision lost), normal, or overflowed to inf.
- Model states (Rajbhandari et al. 2020, "ZeRO", section 3.1 and section 5): mixed-precision
  Adam keeps 2Ψ compute parameters + 2Ψ gradients + 12Ψ fp32 optimizer states (master copy,
  momentum, variance); `model_state_terms` splits `minidist.zero.theory.memory_per_device`
  into those four terms per stage, `rank_bytes` adds what a real rank also holds.
- Bytes per step: the all-gathers of parameters run in the compute dtype (half of fp32's
  bytes for bf16 or fp16), the gradient reduction in the reduce dtype, and the loss scaler
  adds one 4-byte all-reduce of "found inf" per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import comm
from ..fsdp import theory as fsdp_theory
from ..policy import MixedPrecision
from ..zero import theory as zero_theory

FORMATS = (torch.float32, torch.float16, torch.bfloat16)
FOUND_INF_BYTES = 4  # the scaler's flag: one float32


@dataclass(frozen=True)
class FloatFormat:
    """A floating-point format's layout, range and precision (all from `torch.finfo`)."""

    name: str
    bits: int
    exponent_bits: int
    mantissa_bits: int  # stored fraction bits (the leading 1 of a normal number is implicit)
    max: float  # the largest finite value
    smallest_normal: float  # below it numbers are subnormal: fewer significant bits
    smallest_subnormal: float  # half of it or less rounds to zero (a tie goes to even: 0)
    eps: float  # the gap between 1 and the next number: relative rounding up to eps/2


def float_format(dtype: torch.dtype) -> FloatFormat:
    """The format of a floating dtype; the smallest subnormal is smallest_normal · eps."""
    if not dtype.is_floating_point:
        raise ValueError(f"float_format: {dtype} is not a floating-point dtype")
    fi = torch.finfo(dtype)
    mantissa = round(-math.log2(fi.eps))
    return FloatFormat(
        name=str(dtype).removeprefix("torch."),
        bits=fi.bits,
        exponent_bits=fi.bits - 1 - mantissa,
        mantissa_bits=mantissa,
        max=fi.max,
        smallest_normal=fi.smallest_normal,
        smallest_subnormal=fi.smallest_normal * fi.eps,
        eps=fi.eps,
    )


def dtype_bytes(dtype: torch.dtype) -> int:
    return torch.finfo(dtype).bits // 8


FATES = ("zero", "subnormal", "normal", "overflow")


@torch.no_grad()
def fate(values: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> dict[str, float]:
    """Fractions of the nonzero `values` (measured in fp32) that, multiplied by `scale` and
    cast to `dtype`, become zero (flushed: underflow), subnormal, normal, or inf (overflow).

    The cast itself decides (round to nearest even), so the boundaries are exact.
    """
    v = values.detach().double().abs().flatten()
    v = v[v > 0] * scale
    if v.numel() == 0:
        return dict.fromkeys(FATES, 0.0)
    cast = v.to(dtype).double()
    f = float_format(dtype)
    counts = {
        "zero": cast == 0,
        "subnormal": (cast > 0) & (cast < f.smallest_normal),
        "normal": (cast >= f.smallest_normal) & torch.isfinite(cast),
        "overflow": torch.isinf(cast),
    }
    return {k: float(mask.sum()) / v.numel() for k, mask in counts.items()}


def largest_safe_scale(max_abs: float, dtype: torch.dtype) -> float:
    """The largest power of two S with max_abs · S below the format's max (no overflow)."""
    if max_abs <= 0:
        raise ValueError(f"largest_safe_scale: max_abs must be > 0, got {max_abs}")
    return 2.0 ** math.floor(math.log2(float_format(dtype).max / max_abs))


# -- model states ------------------------------------------------------------------------------

STATE_TERMS = ("params", "grads", "master", "moments")


def model_state_terms(
    num_params: float,
    world_size: int,
    stage: int,
    compute_bytes: float = 2,
    master_bytes: float = 4,
    moment_bytes: float = 8,
) -> dict[str, float]:
    """Bytes per rank of the four model states of mixed-precision Adam (ZeRO section 3.1),
    sharded by ZeRO stage (section 5): compute parameters 2Ψ (sharded in stage 3), gradients
    2Ψ (stages 2-3), and the optimizer states K = 12: fp32 master 4Ψ and Adam's momentum and
    variance 8Ψ (stages 1-3). The sum is `zero.theory.memory_per_device`."""
    if stage not in zero_theory.STAGES:
        raise ValueError(f"stage must be one of {zero_theory.STAGES}, got {stage}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    n, psi = world_size, num_params
    return {
        "params": compute_bytes * psi / (n if stage >= 3 else 1),
        "grads": compute_bytes * psi / (n if stage >= 2 else 1),
        "master": master_bytes * psi / (n if stage >= 1 else 1),
        "moments": moment_bytes * psi / (n if stage >= 1 else 1),
    }


def rank_bytes(
    padded: int,
    world_size: int,
    stage: int,
    frozen: int = 0,
    adam_steps: int = 0,
    compute_bytes: int = 2,
) -> int:
    """Model-state bytes a minidist rank holds after a mixed-precision step: (2 + 2 + 12)Ψ
    sharded by stage, for `padded` trainable elements, plus the frozen parameters (kept
    whole, in the compute dtype) and Adam's 4-byte step counter per tensor it steps (one
    per ZeRO bucket shard or FSDP unit). What `minidist.memory.model_state_bytes` measures."""
    states = zero_theory.memory_per_device(
        padded, world_size, stage, param_bytes=compute_bytes, grad_bytes=compute_bytes
    )
    return int(states) + compute_bytes * frozen + 4 * adam_steps


# -- bytes per step ----------------------------------------------------------------------------


def zero_bytes_sent_per_step(padded: int, world_size: int, policy: MixedPrecision) -> dict:
    """ZeRO stages 1-2: the gradients reduce-scattered in `reduce_dtype`, the updated
    parameters all-gathered in `param_dtype`, (N-1)/N of each on a ring."""
    return {
        "reduce_scatter": comm.ring_bytes(
            "reduce_scatter", padded * dtype_bytes(policy.reduce_dtype), world_size
        ),
        "all_gather": comm.ring_bytes(
            "all_gather", padded * dtype_bytes(policy.param_dtype), world_size
        ),
    }


def fsdp_bytes_sent_per_step(
    unit_numels: list[int],
    world_size: int,
    policy: MixedPrecision,
    reshard_after_forward: bool = True,
) -> dict:
    """FSDP (root unit last): `minidist.fsdp.theory.bytes_sent_per_step` with the all-gathers
    in `param_dtype` and the reduce-scatters in `reduce_dtype`."""
    gathers = fsdp_theory.bytes_sent_per_step(
        unit_numels, world_size, reshard_after_forward, element_size=dtype_bytes(policy.param_dtype)
    )
    reduces = fsdp_theory.bytes_sent_per_step(
        unit_numels,
        world_size,
        reshard_after_forward,
        element_size=dtype_bytes(policy.reduce_dtype),
    )
    return {"all_gather": gathers["all_gather"], "reduce_scatter": reduces["reduce_scatter"]}


def found_inf_bytes(world_size: int) -> float:
    """What the loss scaler's agreement costs per step: one all-reduce of one float32."""
    return comm.ring_bytes("all_reduce", FOUND_INF_BYTES, world_size)


# -- the reduction in low precision ------------------------------------------------------------


@torch.no_grad()
def ring_mean(
    values: list[float], dtype: torch.dtype, pre: float, post: float
) -> tuple[float, float]:
    """The mean of one element held by N ranks, reduced in `dtype` as a ring adds it: each
    rank's value divided by `pre` and rounded to `dtype`, summed one rank at a time in
    `dtype`, the sum divided by `post`. Returns (largest partial sum, mean), as floats."""
    total = torch.tensor(0.0, dtype=dtype, device="cpu")
    largest = 0.0
    for v in values:
        total = total + (torch.tensor(v, dtype=dtype, device="cpu") / pre).to(dtype)
        largest = max(largest, abs(float(total)))
    return largest, float(total / post)
