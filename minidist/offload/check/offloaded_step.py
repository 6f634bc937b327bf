"""offload checker: exercise 1: the offloaded step (Ren et al. 2021, "ZeRO-Offload", sections
3-4). This module holds the rank-side runner and its measurements: `_Bus` records every copy
between a device tensor and a host tensor, `_step_rank` runs the learner's step inside FSDP
training and records, step by step, what moved, what `m.grad` held when the host optimizer
stepped and how the values compare with Adam on the device; and `check_offloaded_step`, which
runs it on worlds of 2 and 3. The messages naming each mistake are in
`offloaded_step_diagnoses`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ...course.check import fail, passed, run_on_world
from ...data import shard_batch
from ...data_parallel.fixture import build
from ...fsdp.fixture import UNITS
from ...fsdp.fully_sharded import FullyShardedDataParallel
from ...runtime import RankFailedError
from ...training import max_abs_diff
from ...zero.fixture import ZERO_MLP
from .offloaded_step_diagnoses import _diagnose_rank_failure, _diagnose_step

STEP_WORLDS = (2, 3)
STEPS = 3
LR = 1e-2
# FSDP against one process, as in tests/test_fsdp.py: float32 summation order, which Adam's
# ±lr steps do not shrink; a stale or skipped update moves a parameter by about lr.
PARAM_TOL = 1e-4
STEP_HANG_HINT = (
    "The step itself needs no collective: a rank that waits forever is one whose FSDP "
    "forward or backward the others never reached (did a rank raise or return early?)."
)


def make_host_adam(masters: list[torch.Tensor]) -> torch.optim.Optimizer:
    """The host optimizer the checker hands to your step (module level: it travels to ranks)."""
    return torch.optim.Adam(masters, lr=LR)


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class _Bus(TorchDispatchMode):
    """Records every `copy_` between a device tensor and a host tensor: ("d2h" | "h2d",
    bytes). Device tensors: the storages given, and any new tensor computed from them (a
    clone of a device gradient stays on the device). Everything else is on the host."""

    def __init__(self, device: list[torch.Tensor], events: list):
        super().__init__()
        self.device = {_key(t) for t in device if t.numel()}
        self.keep: list[torch.Tensor] = []  # keeps derived storages alive: no address reuse
        self.events = events

    def on_device(self, t: torch.Tensor) -> bool:
        return t.numel() > 0 and _key(t) in self.device

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is torch.ops.aten.copy_.default:
            dst, src = args[0], args[1]
            nbytes = src.numel() * src.element_size()
            if self.on_device(src) and not self.on_device(dst):
                self.events.append(("d2h", nbytes))
            elif self.on_device(dst) and not self.on_device(src):
                self.events.append(("h2d", nbytes))
            return out
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if any(self.on_device(t) for t in inputs):
            known = {_key(t) for t in inputs}
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.numel() and _key(t) not in known:
                    self.device.add(_key(t))
                    self.keep.append(t)
        return out


def _mlp_fsdp():
    """Lesson 01's MLP (3-element last bias), one FSDP unit per Linear; 12 samples a step."""
    model, batches, loss_fn = build("mlp", steps=STEPS, global_batch=12, **ZERO_MLP)
    return FullyShardedDataParallel(model, wrap=UNITS["mlp"]), batches, loss_fn


def _on_device_run() -> list[list[torch.Tensor]]:
    """The same FSDP with Adam on the device: this rank's chunks after every step."""
    rank, world = dist.get_rank(), dist.get_world_size()
    fsdp, batches, loss_fn = _mlp_fsdp()
    params = fsdp.sharded_parameters()
    opt = make_host_adam(params)
    out = []
    for batch in batches:
        x, y = shard_batch(batch, rank, world)
        opt.zero_grad()
        loss_fn(fsdp(x), y).backward()
        opt.step()
        out.append([p.detach().clone() for p in params])
    return out


def _equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def _holds(held: list[torch.Tensor | None], tensors: list[torch.Tensor]) -> bool:
    """Every buffer in `held` exists and equals its tensor in `tensors`."""
    return all(g is not None and torch.equal(g, w) for g, w in zip(held, tensors))


def _step_rank(fn: Callable) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    expected = _on_device_run()
    fsdp, batches, loss_fn = _mlp_fsdp()
    params = fsdp.sharded_parameters()
    storages = [_key(p) for p in params]
    masters = [p.detach().clone() for p in params]
    for m in masters:
        m.grad = torch.zeros_like(m)
    host = make_host_adam(masters)
    steps = []
    for k, batch in enumerate(batches):
        x, y = shard_batch(batch, rank, world)
        for p in params:
            p.grad = None
        loss_fn(fsdp(x), y).backward()
        grads = [p.grad.detach().clone() for p in params]
        p_before = [p.detach().clone() for p in params]
        m_before = [m.detach().clone() for m in masters]
        events: list = []
        bus = _Bus([*params, *[p.grad for p in params]], events)

        def at_step(opt, args, kwargs, grads=grads, events=events, bus=bus, k=k):
            held = [m.grad for m in masters]
            events.append(("step", 0))
            at_step.seen = {
                "none": any(g is None for g in held),
                "equal": _holds(held, grads),
                "zero": all(g is not None and not g.any() for g in held),
                "previous": k > 0 and _holds(held, steps[-1]["grads"]),
                "on_device": any(g is not None and bus.on_device(g) for g in held),
            }

        at_step.seen = None
        hook = host.register_step_pre_hook(at_step)
        with bus:
            fn(params, masters, host)
        hook.remove()
        steps.append(
            dict(
                events=events,
                at_step=at_step.seen,
                grads=grads,
                p_changed=not _equal([p.detach() for p in params], p_before),
                m_changed=not _equal([m.detach() for m in masters], m_before),
                p_equals_m=_equal([p.detach() for p in params], [m.detach() for m in masters]),
                p_equals_m_before=_equal([p.detach() for p in params], m_before),
                p_equals_expected=_equal([p.detach() for p in params], expected[k]),
                m_equals_expected=_equal([m.detach() for m in masters], expected[k]),
                rebound=[_key(p) for p in params] != storages,
                grad_on_device=any(m.grad is not None and bus.on_device(m.grad) for m in masters),
            )
        )
    owned = sum(p.numel() for p in params)
    return dict(steps=steps, owned=owned, full=fsdp.full_parameters())


def _step_reference() -> dict[str, torch.Tensor]:
    """One process, Adam: the parameters after the last step."""
    model, batches, loss_fn = build("mlp", steps=STEPS, global_batch=12, **ZERO_MLP)
    opt = make_host_adam([p for p in model.parameters() if p.requires_grad])
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def check_offloaded_step(offloaded_step: Callable) -> None:
    """Train FSDP with `offloaded_step(params, masters, host_optimizer)` on N = 2 and 3."""
    reference = _step_reference()
    for world in STEP_WORLDS:
        try:
            results = run_on_world(_step_rank, world, offloaded_step, hang_hint=STEP_HANG_HINT)
        except RankFailedError as exc:
            problem = _diagnose_rank_failure(exc)
            if problem:
                fail(problem)
            raise
        diff = max(max_abs_diff(r["full"], reference) for r in results)
        diverged = (
            f" After {STEPS} steps the parameters differ from one process's Adam by "
            f"{diff:.2g} (tolerance {PARAM_TOL:g})."
        )
        for rank, res in enumerate(results):
            for k, s in enumerate(res["steps"]):
                problem = _diagnose_step(s, res["owned"], diverged)
                if problem:
                    fail(f"on {world} ranks, rank {rank}, step {k}: {problem}")
        if diff >= PARAM_TOL:
            fail(f"on {world} ranks every step looks right, yet{diverged}")
    passed(
        f"offloaded_step trains FSDP exactly like Adam on the device for N = 2 and 3 ({STEPS} "
        "steps, equal to one process): gradients down, the update on the host, parameters "
        "up, 4 + 4 bytes per owned element per step (2 + 2 in mixed precision: ZeRO-Offload's "
        "4Ψ)"
    )
