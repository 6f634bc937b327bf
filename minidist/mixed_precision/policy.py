"""Which dtype each thing lives in: fp32 master state, low-precision compute copies.

Micikevicius et al. 2018, "Mixed Precision Training", section 3: keep an fp32 master copy
of the weights for the update (small updates vanish when added to fp16 weights), compute
forward and backward in fp16 or bf16, and accumulate/reduce gradients in fp32 where range
matters. `MixedPrecision` mirrors `torch.distributed.fsdp.MixedPrecision`'s names:

- `param_dtype`: the compute copies, made just before use; the all-gather of FSDP runs in it
  (half the bytes of fp32);
- `reduce_dtype`: the dtype of the gradient reduction. In fp16 a sum over N ranks can
  overflow and the mean of small gradients underflow, so the division by N is split into a
  pre-divide before the reduction and a post-divide after it (`divide_factors`, as PyTorch
  FSDP does: about √N each).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class MixedPrecision:
    """`loss_scaler` (a `DynamicLossScaler`) is required with fp16 compute: without it the
    small gradients underflow (the training loop calls `policy.loss_scaler.scale(loss)`)."""

    param_dtype: torch.dtype = torch.bfloat16
    reduce_dtype: torch.dtype = torch.float32
    loss_scaler: object | None = None

    def __post_init__(self):
        for name in ("param_dtype", "reduce_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(
                    f"MixedPrecision: {name}={getattr(self, name)} is not supported; choose "
                    f"one of {[str(d) for d in DTYPES]}"
                )
        if self.param_dtype is torch.float16 and self.loss_scaler is None:
            raise ValueError(
                "MixedPrecision: param_dtype=torch.float16 needs a loss scaler (fp16 flushes "
                "gradients below 2^-24 to zero): MixedPrecision(torch.float16, "
                "loss_scaler=DynamicLossScaler()), then scale the loss with it"
            )


def divide_factors(world_size: int) -> tuple[float, float]:
    """(pre, post) with pre · post = N: pre is the largest power of 2 dividing N with
    pre² ≤ N, so neither the sum of N pre-divided values nor their post-divided mean leaves
    the fp16 range needlessly. (PyTorch FSDP's `_get_gradient_predivide_factor` doubles
    while N / pre > pre, so it rounds the other way: N = 8 gives it 4 and 2, here 2 and 4.)"""
    pre = 1
    while world_size % (pre * 2) == 0 and world_size / (pre * 2) >= pre * 2:
        pre *= 2
    return float(pre), world_size / pre


def cast_floating(tree, dtype: torch.dtype):
    """Floating-point tensors in a (nested) tuple/list/dict cast to `dtype`; the rest as is.
    What a wrapper does to its forward's inputs (to the compute dtype) and output (to fp32)."""
    if isinstance(tree, torch.Tensor):
        return tree.to(dtype) if tree.is_floating_point() else tree
    if isinstance(tree, (tuple, list)):
        return type(tree)(cast_floating(t, dtype) for t in tree)
    if isinstance(tree, dict):
        return {k: cast_floating(v, dtype) for k, v in tree.items()}
    return tree


def cast_module_state(module, dtype: torch.dtype) -> None:
    """Cast a module's floating parameters and buffers to `dtype`, in place. For what a
    wrapper leaves outside its fp32 master state (frozen parameters, buffers)."""
    for t in [*module.parameters(), *module.buffers()]:
        if t.is_floating_point():
            t.data = t.data.to(dtype)
