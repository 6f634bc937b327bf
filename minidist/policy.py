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
  each, as in PyTorch FSDP, which rounds the other way when N is not a power of 4);
- `buffer_dtype`: None (the default) leaves buffers in their own dtype, as FSDP2 does (a
  rotary `inv_freq` in bf16 is off by radians at long positions); a dtype casts them, as
  FSDP1's `buffer_dtype` does.

A wrapper casts its forward's inputs to `param_dtype` and its output to fp32 through any
structure (`map_tensors`: tuples, lists, namedtuples, dicts and their subclasses,
dataclasses such as Hugging Face's `ModelOutput`), rebuilding the same type, as FSDP2 does.

Device: tensors follow their module. `module_device(module)` is where a wrapper allocates
its buffers, shards and flags for that module (`cuda:i` on a GPU rank, else the CPU).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Callable, Mapping
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
    buffer_dtype: torch.dtype | None = None  # None: buffers keep their dtype (FSDP2)

    def __post_init__(self):
        for name in ("param_dtype", "reduce_dtype", "buffer_dtype"):
            if name == "buffer_dtype" and self.buffer_dtype is None:
                continue
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


def map_tensors(fn: Callable[[torch.Tensor], object], tree):
    """`tree` with every tensor replaced by `fn(tensor)`, rebuilt as the same type: tuples,
    lists, namedtuples, dicts (and subclasses: OrderedDict, Hugging Face's `ModelOutput`)
    and dataclasses, nested; anything else is returned as is."""
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        fields = dataclasses.fields(tree)
        out = dataclasses.replace(
            tree, **{f.name: map_tensors(fn, getattr(tree, f.name)) for f in fields if f.init}
        )
        for f in fields:
            if not f.init and hasattr(tree, f.name):
                object.__setattr__(out, f.name, map_tensors(fn, getattr(tree, f.name)))
        return out
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a namedtuple
        return type(tree)(*(map_tensors(fn, t) for t in tree))
    if isinstance(tree, (tuple, list)):
        return type(tree)(map_tensors(fn, t) for t in tree)
    if isinstance(tree, Mapping):
        if type(tree) is dict:
            return {k: map_tensors(fn, v) for k, v in tree.items()}
        out = copy.copy(tree)  # keeps the subclass and its attributes (OrderedDict, ...)
        for k, v in tree.items():
            out[k] = map_tensors(fn, v)
        return out
    return tree


def tree_tensors(tree) -> list[torch.Tensor]:
    """Every tensor in `tree` (the structures `map_tensors` walks), in order."""
    found: list[torch.Tensor] = []
    map_tensors(found.append, tree)
    return found


def cast_floating(tree, dtype: torch.dtype):
    """Floating-point tensors in `tree` cast to `dtype`, the structure kept (`map_tensors`).
    What a wrapper does to its forward's inputs (to the compute dtype) and output (to fp32)."""
    return map_tensors(lambda t: t.to(dtype) if t.is_floating_point() else t, tree)


def cast_module_state(module, dtype: torch.dtype, buffer_dtype: torch.dtype | None = None):
    """Cast a module's floating parameters to `dtype` in place, and its floating buffers to
    `buffer_dtype` (None: buffers keep their dtype). For what a wrapper leaves outside its
    fp32 master state (frozen parameters, buffers)."""
    casts = [(p, dtype) for p in module.parameters()]
    if buffer_dtype is not None:
        casts += [(b, buffer_dtype) for b in module.buffers()]
    for t, to in casts:
        if t.is_floating_point():
            t.data = t.data.to(to)


def to_device(tree, device):
    """Tensors in `tree` moved to `device`, the structure kept (`map_tensors`). What a loop
    does to a batch built on the CPU before it meets a module on a GPU."""
    return map_tensors(lambda t: t.to(device), tree)


def module_device(module) -> torch.device:
    """Where a wrapper allocates for `module`: the device of its first parameter or buffer
    (the CPU for a module with neither)."""
    first = next(itertools.chain(module.parameters(), module.buffers()), None)
    return first.device if first is not None else torch.device("cpu")
