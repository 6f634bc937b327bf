"""Activation recomputation: keep a segment's inputs, not its activations; redo it in backward.

Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost" (arXiv:1604.06174),
sections 3-4: a forward segment runs without saving anything for backward except its
inputs; when backward reaches the segment, it runs the segment's forward again, this time
recording the graph, and back-propagates through it. Memory for L layers cut into segments
of k: L/k saved inputs plus one segment's activations, smallest near k = √L; the price is
one more forward per step.

RNG: the recomputed forward must draw the same dropout masks, so the CPU (and, where used,
CUDA) random state at the segment's start is saved and restored for the recomputation.

Two forms, with torch's names (`torch.utils.checkpoint.checkpoint(..., use_reentrant=)`):

- reentrant (`use_reentrant=True`, `checkpoint`'s default and the lesson's: the inputs are
  what autograd saves, so `SavedActivations` counts them): an autograd `Function` whose
  backward runs the recomputation and a backward of its own inside the outer one. Gradients
  of parameters in the segment reach their `.grad` (or an FSDP unit's flat parameter) from
  that inner backward; the output must be a tensor or a tuple and require grad.
- non-reentrant (`use_reentrant=False`, `recompute`'s default, the form torch recommends):
  the forward runs under `saved_tensors_hooks` that keep an index instead of each saved
  tensor; the first unpack in backward recomputes the segment and hands back the recomputed
  tensors, and the outer backward goes on through the forward's own graph. Any output
  structure works, and state a block changes as it runs never feeds a second, inner backward.

Both take keyword arguments (`block(h, attention_mask=m)`), tensors nested in any structure
included (`position_embeddings=(cos, sin)`). A Hugging Face layer's K/V cache is left out
of a recomputed layer, as HF's own gradient checkpointing does (see `_without_cache`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn as nn

from ..memory import kept_for_backward
from ..policy import map_tensors, tree_tensors


def _capture_rng():
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _rerun(fn: Callable, rng, *args, **kwargs):
    """`fn` again with the random state of the first run (same dropout masks), recording."""
    cpu, cuda = rng
    with torch.random.fork_rng(devices=list(range(len(cuda))) if cuda is not None else []):
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        with torch.enable_grad():
            return fn(*args, **kwargs)


def _detached(tree):
    return map_tensors(lambda t: t.detach().requires_grad_(t.requires_grad), tree)


class _RecomputeFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, *args):
        ctx.fn = fn
        ctx.rng = _capture_rng()
        ctx.tensor_index = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        ctx.others = [None if isinstance(a, torch.Tensor) else a for a in args]
        ctx.save_for_backward(*(args[i] for i in ctx.tensor_index))
        with torch.no_grad():
            out = fn(*args)
        if not isinstance(out, (torch.Tensor, tuple)):
            raise TypeError(
                f"checkpoint(use_reentrant=True): the segment returned a {type(out).__name__}; "
                "the reentrant form passes gradients through a tensor or a tuple of tensors "
                "only: use use_reentrant=False for any other output"
            )
        return out

    @staticmethod
    def backward(ctx, *grad_outputs):
        args = list(ctx.others)
        for i, t in zip(ctx.tensor_index, ctx.saved_tensors):
            args[i] = t.detach().requires_grad_(t.requires_grad)
        outputs = _rerun(ctx.fn, ctx.rng, *args)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [
            (o, g)
            for o, g in zip(outputs, grad_outputs)
            if isinstance(o, torch.Tensor) and o.requires_grad and g is not None
        ]
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        grads = [
            args[i].grad if isinstance(args[i], torch.Tensor) else None for i in range(len(args))
        ]
        return (None, *grads)


def _checkpoint_reentrant(fn: Callable, args: tuple, kwargs: dict):
    """Every tensor of args and kwargs, nested ones too, becomes an input of the Function
    (so each gets its gradient); the structure is rebuilt around them for `fn`."""
    tensors = tree_tensors((args, kwargs))

    def run(*given):
        it = iter(given)
        a, k = map_tensors(lambda _: next(it), (args, kwargs))
        return fn(*a, **k)

    return _RecomputeFunction.apply(run, *tensors)


def _checkpoint_non_reentrant(fn: Callable, args: tuple, kwargs: dict):
    """`fn` whose saved tensors are dropped in forward and recomputed at the first unpack."""
    rng, packed, recomputed = _capture_rng(), [0], {}

    def recompute() -> None:
        order: list[torch.Tensor] = []

        def keep(t):
            order.append(t)
            return len(order) - 1

        a, k = _detached((args, kwargs))
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda i: order[i]):
            _rerun(fn, rng, *a, **k)
        if len(order) != packed[0]:
            raise RuntimeError(
                f"checkpoint(use_reentrant=False): the recomputed forward saved {len(order)} "
                f"tensors where the forward saved {packed[0]}: the segment must run the same "
                "ops both times (no branch on state that the first run changed)"
            )
        recomputed.update(enumerate(order))

    def pack(t: torch.Tensor) -> int:
        packed[0] += 1
        return packed[0] - 1

    def unpack(i: int) -> torch.Tensor:
        if i not in recomputed:  # first unpack of this backward (again under retain_graph)
            recompute()
        if _retaining[0] and torch._C._current_autograd_node() in _retaining[0]:
            return recomputed[i]
        return recomputed.pop(i)

    # the inputs live until backward in `recompute`'s closure, not in autograd's saved
    # tensors: counted where activations are measured (Chen et al.'s kept segment inputs)
    kept_for_backward(tree_tensors((args, kwargs)))
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        return fn(*args, **kwargs)


_retaining: list[set] = [set()]  # the nodes of a second backward (`retain_recomputed`)


@contextlib.contextmanager
def retain_recomputed(nodes: set):
    """Inside, a recomputed tensor that one of the autograd `nodes` unpacks stays after its
    use, for a second backward through the same graph that runs those nodes again: lesson
    09's zero-bubble W computes the weight gradients from what its B recomputed, so each
    segment is recomputed once. W frees them as it uses them."""
    before, _retaining[0] = _retaining[0], nodes
    try:
        yield
    finally:
        _retaining[0] = before


def checkpoint(fn: Callable, *args, use_reentrant: bool = True, **kwargs):
    """`fn(*args, **kwargs)`, saving only the inputs for backward and recomputing `fn` there
    (`use_reentrant`: which form, see the module docstring; torch's default is False)."""
    if use_reentrant:
        return _checkpoint_reentrant(fn, args, kwargs)
    return _checkpoint_non_reentrant(fn, args, kwargs)


# A recomputation must have no side effect on state the forward already changed. HF decoder
# layers get the model's K/V cache (`cache=`, `past_key_values=`, GPT-2's second positional
# argument) and append this step's K/V to it; recomputed in backward, they would append it
# again and attend over both copies: with the reentrant form k_proj/v_proj got zero
# gradients (the first copy, made under no_grad, has no graph; loss off by 8e-4 to 1.8e-2
# after 3 steps), with either form a padding mask or a sliding window no longer matched the
# keys' length (torch's checkpoint crashes there too). Refusing would break every plain
# `model(ids, labels=...)` call (configs default to use_cache=True); HF's own
# `GradientCheckpointingLayer` instead runs a checkpointed layer without the cache
# (`use_cache=False`, `cache=None`), and so does `recompute`: the layer then computes what
# it computes from an empty cache, the case of a training step. A cache that already holds
# this layer's earlier tokens would change the result if dropped: that is refused.


def _is_cache(x) -> bool:
    """A transformers `Cache` (by class name, so transformers is not imported). Legacy tuple
    caches are values the layer returns, not state it changes: they are left as they are."""
    return any(c.__name__ == "Cache" for c in type(x).__mro__)


def _layer_index(module: nn.Module) -> int:
    """The `layer_idx` HF gives a layer's attention (the slot it writes in the cache)."""
    for m in module.modules():
        if isinstance(getattr(m, "layer_idx", None), int):
            return m.layer_idx
    return 0


def _without_cache(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """`args`, `kwargs` with any transformers Cache replaced by None (and use_cache=False),
    refused when it already holds this layer's earlier tokens."""
    found = [(i, a) for i, a in enumerate(args) if _is_cache(a)]
    found += [(k, v) for k, v in kwargs.items() if _is_cache(v)]
    if not found:
        return args, kwargs
    for where, cache in found:
        held = cache.get_seq_length(_layer_index(module))
        if held:
            arg = f"argument {where}" if isinstance(where, int) else f"{where}="
            raise ValueError(
                f"recompute({type(module).__name__}): its {arg} holds {held} earlier tokens; a "
                "recomputed layer runs without the cache (the recomputation would append to "
                "it again), so dropping it would change the result: call the model with "
                "use_cache=False and no past cache"
            )
    args = tuple(None if _is_cache(a) else a for a in args)
    kwargs = {k: None if _is_cache(v) else v for k, v in kwargs.items()}
    if "use_cache" in kwargs:
        kwargs["use_cache"] = False
    return args, kwargs


def recompute(module: nn.Module, use_reentrant: bool = False) -> nn.Module:
    """Make `module`'s forward recomputed in backward, in place; names and hooks unchanged.

    The module's class is swapped for a subclass whose `forward` runs the original one
    (any positional and keyword arguments) through `checkpoint(..., use_reentrant=)`, the
    way `torch.distributed.fsdp.fully_shard` extends a module's class. Its hooks run once,
    around the first forward. Composes with an FSDP unit on the same module: its
    pre-backward hook re-gathers the parameters before the recomputation, into the storage
    the forward's views still point at. Non-reentrant by default, as torch recommends; a
    Hugging Face K/V cache passed to the module is left out while grad is enabled (as
    HF's own gradient checkpointing does, see `_without_cache`).
    """
    cls = type(module)
    if getattr(cls, "_minidist_recompute", False):
        raise ValueError(f"{cls.__name__} is already recomputed")

    def forward(self, *args, **kwargs):
        plain = super(recomputed, self).forward
        if not torch.is_grad_enabled():
            return plain(*args, **kwargs)
        reentrant = self._minidist_reentrant
        args, kwargs = _without_cache(self, args, kwargs)
        if reentrant and not any(t.requires_grad for t in tree_tensors((args, kwargs))):
            if any(p.requires_grad for p in self.parameters()):
                raise ValueError(
                    f"recompute({cls.__name__}, use_reentrant=True): no input requires grad, "
                    "so backward never reaches the reentrant segment and its parameters get "
                    "no gradient (torch's reentrant checkpoint has the same rule): use "
                    "use_reentrant=False"
                )
        return checkpoint(plain, *args, use_reentrant=reentrant, **kwargs)

    recomputed = type(f"Recomputed{cls.__name__}", (cls,), {"forward": forward})
    recomputed._minidist_recompute = True
    module.__class__ = recomputed
    module._minidist_reentrant = use_reentrant
    return module


def checkpoint_sequential(
    modules, segment: int, x: torch.Tensor, use_reentrant: bool = True
) -> torch.Tensor:
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
        x = checkpoint(run(start), x, use_reentrant=use_reentrant)
    return x
