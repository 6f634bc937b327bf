"""What every parallel wrapper shares: the comparison contract and the start-up checks.

**The comparison contract.** Each technique is checked against the same model trained in
one process. A replicated wrapper (DDP) holds the whole model on every rank, a sharded one
(ZeRO, FSDP) a slice of each parameter, a split one (tensor parallel) a slice of each layer,
a staged one (pipeline) some layers. `ParallelModule` asks each of them for the same thing:
the full, unsharded parameters and gradients under the single-process model's names,
gathered on demand (`full_parameters`, `full_grads`), and one call after backward that
finishes the gradient synchronisation (`finish_gradient_sync`). `minidist.training.train`
and the step timeline use only that interface, never a wrapper's internals.

**Start-up.** Every replica must start from the same parameters (`broadcast_parameters`,
as `torch.nn.parallel.DistributedDataParallel` does at construction; a wrapper that cuts
its part from a whole model, tensor, context, pipeline or expert parallel, broadcasts that
whole model first, so that ranks seeded differently, as under torchrun, still cut the same
model), and every rank must
hold the same model: a rank with a different layer shape or layer count would issue
collectives of other sizes or in another order, which hangs or aborts inside the backend
much later. `verify_same_model` checks it with one small collective and names the first
parameter that differs (DDP's `_verify_param_shape_across_processes` does the same).

**Flat collectives.** `broadcast_parameters` and `all_reduce_flat` (lesson 16's gradient sums,
lesson 17's HSDP and replicated-weight sums) send many tensors as one concatenation, one call
per group, as DDP's buckets do; `copy_flat_into` copies the result back.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn

from . import comm


class ParallelModule(nn.Module):
    """A parallel wrapper around `self.module`, comparable with the single-process model.

    The defaults describe a replicated model (every rank holds all of `self.module`);
    sharded, split and staged wrappers override `full_parameters` and `full_grads` to gather.
    """

    module: nn.Module
    supports_no_sync = False  # wrappers that honour `require_backward_grad_sync` set True
    require_backward_grad_sync = True  # torch DDP's flag, which `no_sync()` switches off

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally; the first backward after the block reduces them."""
        if not self.supports_no_sync:
            raise NotImplementedError(f"{type(self).__name__} has no no_sync()")
        previous, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def finish_gradient_sync(self) -> None:
        """Called after `backward()`, before `optimizer.step()`; a no-op where hooks did it."""

    def memory_tensors(self) -> dict:
        """What this rank holds, for `minidist.memory.state_bytes`: {"params", "grads",
        "buffers": tensors, "optimizer": the wrapper's own optimizer or None}. Wrappers that
        keep state beyond their registered parameters (flat buckets, gathered flat
        parameters, gradient chunks) add it."""
        params = list(self.parameters())
        return {
            "params": params,
            "grads": [p.grad for p in params if p.grad is not None],
            "buffers": list(self.buffers()),
            "optimizer": None,
        }

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter, whole, under the single-process model's name (a copy)."""
        return named_parameters(self.module)

    def full_grads(self) -> dict[str, torch.Tensor]:
        """Every gradient that exists, whole, under the single-process model's name (a copy)."""
        return named_grads(self.module)


def named_parameters(module: nn.Module) -> dict[str, torch.Tensor]:
    """{name: a copy of the parameter} of a module every rank holds whole."""
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def named_grads(module: nn.Module) -> dict[str, torch.Tensor]:
    """{name: a copy of the gradient} for every parameter that has one."""
    return {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}


def first_rank(group) -> int:
    """Global rank of the group's rank 0: the source of the initial broadcast."""
    return dist.get_global_rank(group, 0) if group is not None else 0


def broadcast_parameters(module: nn.Module, group=None) -> None:
    """Make every replica start from the group's rank 0 parameters and buffers: one
    broadcast of their concatenation per dtype (DDP's `_sync_module_states` coalesces them
    too: a model's tens of small tensors are otherwise tens of collectives)."""
    by_dtype: dict[tuple, list[torch.Tensor]] = {}
    for t in list(module.parameters()) + list(module.buffers()):
        by_dtype.setdefault((t.dtype, t.device), []).append(t.data)
    with torch.no_grad():
        for same in by_dtype.values():
            flat = torch.cat([t.reshape(-1) for t in same])
            comm.broadcast(flat, src=first_rank(group), group=group, tag="init")
            copy_flat_into(flat, same)


def copy_flat_into(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Copy a concatenation (`torch.cat` of the tensors flattened) back into the tensors."""
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def all_reduce_flat(grads: list[torch.Tensor], group, tag: str) -> None:
    """Sum `grads` over `group` in one all-reduce of their concatenation, then copy back."""
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    comm.all_reduce(flat, group=group, tag=tag)
    copy_flat_into(flat, grads)


def verify_same_model(
    module: nn.Module, group=None, who: str = "wrapper", config: dict | None = None
) -> None:
    """Raise on every rank unless every rank's `module` has the same parameters and shapes,
    and every rank passed the wrapper the same `config` (its other constructor arguments,
    {name: value}: a `k` or a capacity factor that differs between ranks would route or
    split differently and the collectives would not match).

    Each rank all-gathers the length of its description (names, shapes, dtypes of parameters
    and buffers in order, and which parameters are frozen: a parameter trainable on one rank
    only would give the ranks gradients of different sizes), then the descriptions themselves
    padded to the longest, so a mismatch costs two small collectives and never a hang. The
    error names the first entry that differs and which ranks hold which version.
    """
    mine = _describe(module, config or {})
    n, dev = dist.get_world_size(group), comm.group_device(group)  # where the backend sends
    # (torch.frombuffer refuses an empty buffer: a model without parameters or buffers)
    encoded = torch.tensor(list(mine.encode()), dtype=torch.uint8, device=dev)
    lengths = torch.zeros(n, dtype=torch.int64, device=dev)
    mine_length = torch.tensor([encoded.numel()], device=dev)
    comm.all_gather(lengths, mine_length, group=group, tag="verify-model")
    longest = int(lengths.max())
    padded = torch.zeros(longest, dtype=torch.uint8, device=dev)
    padded[: encoded.numel()] = encoded
    everyone = torch.empty(n * longest, dtype=torch.uint8, device=dev)
    comm.all_gather(everyone, padded, group=group, tag="verify-model")
    everyone, lengths = everyone.cpu(), lengths.cpu()
    texts = [
        bytes(everyone[r * longest : r * longest + int(lengths[r])].tolist()).decode()
        for r in range(n)
    ]
    if len(set(texts)) == 1:
        return
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(n))
    rows = [t.split("\n") if t else [] for t in texts]  # "" is no entry, not one empty entry
    depth = next(
        i for i in range(max(map(len, rows))) if len({r[i] if i < len(r) else "" for r in rows}) > 1
    )
    versions: dict[str, list[int]] = {}
    for rank, r in zip(ranks, rows):
        versions.setdefault(r[depth] if depth < len(r) else "(nothing: fewer entries)", []).append(
            rank
        )
    detail = "; ".join(f"ranks {rs}: {entry}" for entry, rs in versions.items())
    raise ValueError(
        f"{who}: the model differs between ranks, first at entry {depth} of its arguments, "
        f"parameters and buffers: {detail}. Every rank must build the same model (same "
        "config, same layers, same arguments), or the ranks' collectives will not match."
    )


def _describe(module: nn.Module, config: dict) -> str:
    arguments = [f"argument {k}={v!r}" for k, v in config.items()]
    params = [
        f"parameter {n} {tuple(p.shape)} {p.dtype}{'' if p.requires_grad else ' frozen'}"
        for n, p in module.named_parameters()
    ]
    buffers = [f"buffer {n} {tuple(b.shape)} {b.dtype}" for n, b in module.named_buffers()]
    return "\n".join(arguments + params + buffers)
