"""Which dtype and device each thing lives in: fp32 master state, low-precision compute
copies, on the device of the module they serve.

Micikevicius et al. 2018, "Mixed Precision Training", section 3: keep an fp32 master copy
of the weights for the update (small updates vanish when added to fp16 weights), compute
forward and backward in fp16 or bf16, and accumulate/reduce gradients in fp32 where range
matters. `MixedPrecision` mirrors `torch.distributed.fsdp.MixedPrecision`'s names:

- `param_dtype`: the compute copies, made just before use; the all-gather of FSDP runs in it
  (half the bytes of fp32);
- `reduce_dtype`: the dtype of the gradient reduction. In fp16 a sum over N ranks can
  overflow and the mean of small gradients underflow, so the division by N is split into a
  pre-divide before the reduction and a post-divide after it (`divide_factors`: about √N
  each, as in PyTorch FSDP, which rounds the other way when N is not a power of 4).

Device: tensors follow their module. `module_device(module)` is where a wrapper allocates
its buffers, shards and flags for that module (`cuda:i` on a GPU rank, else the CPU).
"""

from __future__ import annotations

import itertools
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
    the fp16 range needlessly.

    PyTorch FSDP's `_get_gradient_predivide_factor` rounds the other way: for N = 4^k both
    give (√N, √N); for N = 2·4^k torch's pre is the larger factor, (2, 1), (4, 2), (16, 8)
    for N = 2, 8, 128, where this gives (1, 2), (2, 4), (8, 16), leaving more headroom to
    small gradients and less to large sums. For N not a power of 2 torch's pre need not
    divide N (N = 3 gives (2, 1.5)); this pre always does (N = 3 gives (1, 3))."""
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


def to_device(tree, device):
    """Tensors in a (nested) tuple/list/dict moved to `device`; the rest as is. What a loop
    does to a batch built on the CPU before it meets a module on a GPU."""
    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, (tuple, list)):
        return type(tree)(to_device(t, device) for t in tree)
    if isinstance(tree, dict):
        return {k: to_device(v, device) for k, v in tree.items()}
    return tree


def module_device(module) -> torch.device:
    """Where a wrapper allocates for `module`: the device of its first parameter or buffer
    (the CPU for a module with neither)."""
    first = next(itertools.chain(module.parameters(), module.buffers()), None)
    return first.device if first is not None else torch.device("cpu")
