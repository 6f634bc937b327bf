"""Activation recomputation: keep a segment's inputs, not its activations; redo it in backward.

Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost" (arXiv:1604.06174),
sections 3-4: a forward segment runs without saving anything for backward except its
inputs; when backward reaches the segment, it runs the segment's forward again, this time
recording the graph, and back-propagates through it. Memory for L layers cut into segments
of k: L/k saved inputs plus one segment's activations, smallest near k = √L; the price is
one more forward per step.

RNG: the recomputed forward must draw the same dropout masks, so the CPU (and, where used,
CUDA) random state at the segment's start is saved and restored for the recomputation.

This is the "reentrant" form torch calls `torch.utils.checkpoint(..., use_reentrant=True)`:
the recomputation runs a backward of its own inside the outer one. Gradients of parameters
inside the segment reach their `.grad` (or an FSDP unit's flat parameter) from that inner
backward; the segment's output must require grad for backward to reach it at all.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn


class _RecomputeFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, *args):
        ctx.fn = fn
        ctx.cpu_rng = torch.get_rng_state()
        ctx.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        ctx.tensor_index = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        ctx.others = [None if isinstance(a, torch.Tensor) else a for a in args]
        ctx.save_for_backward(*(args[i] for i in ctx.tensor_index))
        with torch.no_grad():
            return fn(*args)

    @staticmethod
    def backward(ctx, *grad_outputs):
        args = list(ctx.others)
        for i, t in zip(ctx.tensor_index, ctx.saved_tensors):
            args[i] = t.detach().requires_grad_(t.requires_grad)
        devices = list(range(len(ctx.cuda_rng))) if ctx.cuda_rng is not None else []
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(ctx.cpu_rng)
            if ctx.cuda_rng is not None:
                torch.cuda.set_rng_state_all(ctx.cuda_rng)
            with torch.enable_grad():
                outputs = ctx.fn(*args)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if o.requires_grad]
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        grads = [
            args[i].grad if isinstance(args[i], torch.Tensor) else None for i in range(len(args))
        ]
        return (None, *grads)


def checkpoint(fn: Callable, *args):
    """`fn(*args)`, saving only `args` for backward and recomputing `fn` there."""
    return _RecomputeFunction.apply(fn, *args)


def recompute(module: nn.Module) -> nn.Module:
    """Make `module`'s forward recomputed in backward, in place; names and hooks unchanged.

    The module's class is swapped for a subclass whose `forward` runs the original one
    through `checkpoint` (the way `torch.distributed.fsdp.fully_shard` extends a module's
    class). Its hooks run once, around the first forward. Composes with an FSDP unit on the
    same module: its pre-backward hook re-gathers the parameters before the recomputation,
    into the storage the forward's views still point at.
    """
    cls = type(module)
    if getattr(cls, "_minidist_recompute", False):
        raise ValueError(f"{cls.__name__} is already recomputed")

    def forward(self, *args):
        plain = super(recomputed, self).forward
        return checkpoint(plain, *args) if torch.is_grad_enabled() else plain(*args)

    recomputed = type(f"Recomputed{cls.__name__}", (cls,), {"forward": forward})
    recomputed._minidist_recompute = True
    module.__class__ = recomputed
    return module


def checkpoint_sequential(modules, segment: int, x: torch.Tensor) -> torch.Tensor:
    """Run `modules` in order on `x`, each run of `segment` consecutive ones recomputed."""
    if segment < 1:
        raise ValueError(f"segment must be >= 1, got {segment}")
    mods = list(modules)

    def run(start: int):
        def segment_forward(h):
            for m in mods[start : start + segment]:
                h = m(h)
            return h

        return segment_forward

    for start in range(0, len(mods), segment):
        x = checkpoint(run(start), x)
    return x
