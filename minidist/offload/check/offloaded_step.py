"""offload checker: exercise 1: the offloaded step."""

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
from .. import theory

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


def _diagnose_step(s: dict, owned: int, diverged: str) -> str | None:
    ops = [op for op, _ in s["events"]]
    if s["rebound"]:
        return (
            "a device parameter now has a new storage: `p.data = ...` (or `p.set_(...)`) "
            "rebinds it, and on a GPU `p.data = m` would move the parameter to the host. Copy "
            "into it instead: `with torch.no_grad(): p.copy_(m)`, the device tensor FSDP "
            "gathers from."
        )
    if "step" not in ops:
        if s["p_changed"]:
            return (
                "the device parameters changed but host_optimizer never stepped (the masters "
                "are unchanged): you stepped on the device copy. Offloading keeps the update "
                "and its Adam state on the host, off the device: copy the gradients into "
                "m.grad, call host_optimizer.step(), copy the masters back."
            )
        return (
            "nothing changed: neither the masters nor the device parameters. Call "
            "host_optimizer.step() between the two copies."
        )
    if ops.count("step") > 1:
        return f"host_optimizer.step() ran {ops.count('step')} times in one step; once."
    seen = s["at_step"]
    if seen["on_device"] or s["grad_on_device"]:
        return (
            "m.grad is the device gradient itself (or computed from it on the device): on a "
            "CPU `p.grad.cpu()` and `p.grad.to('cpu')` return p.grad, and `p.grad.clone()` "
            "stays wherever p.grad is. Copy into the host buffer: m.grad.copy_(p.grad) (on a "
            "GPU into pinned memory, non-blocking)."
        )
    if seen["none"]:
        return (
            "a master's gradient was None when host_optimizer stepped (Adam skips it): "
            "host_optimizer.zero_grad() sets them to None; keep the buffers and copy p.grad "
            "into each m.grad before the step."
        )
    if not seen["equal"]:
        if seen["zero"]:
            what = "zeros"
        elif seen["previous"]:
            what = "the previous step's gradients"
        else:
            what = "something else than this step's gradients"
        return (
            f"host_optimizer stepped while m.grad held {what}: copy each p.grad down into "
            "m.grad (m.grad.copy_(p.grad)) *before* host_optimizer.step()."
        )
    after = ops[ops.index("step") + 1 :]
    if "h2d" not in after:
        if "h2d" in ops:
            return (
                "you copied the masters to the device *before* host_optimizer.step(): the "
                "device runs one step behind the masters (and the next gradients are taken at "
                "stale parameters). ZeRO-Offload's one-step delayed parameter update does "
                "that on purpose, after the first steps, to overlap the CPU's step with the "
                "GPU's next forward; here the result must equal Adam on the device: "
                f"copy back after the step.{diverged}"
            )
        return (
            "the masters were updated but the device parameters were not: forgot to copy the "
            "masters back. The next forward then runs on stale parameters while the host "
            f"trains on its own.{diverged} After host_optimizer.step(): with torch.no_grad(): "
            "p.copy_(m) for every pair."
        )
    if not s["p_equals_m"]:
        return (
            "after the step the device parameters differ from the masters: copy every master "
            "back, all of it, into its own parameter (zip(params, masters))."
        )
    if not (s["p_equals_expected"] and s["m_equals_expected"]):
        return (
            "after the step the parameters differ from the same Adam run on the device, "
            "which gives bit-identical values: copy the gradients down, step once, copy "
            "back, nothing else."
        )
    want = theory.bytes_moved_per_step(owned)
    down = sum(b for op, b in s["events"] if op == "d2h")
    up = sum(b for op, b in s["events"] if op == "h2d")
    if down > want["device_to_host"]:
        return (
            f"the values are right, but {down} bytes went down the bus this step; only the "
            f"gradients must: 4 bytes × {owned} elements = {want['device_to_host']}. The "
            "masters already hold the parameters (they were the last thing copied up), so "
            "copying the parameters down again doubles the traffic."
        )
    if up > want["host_to_device"]:
        return (
            f"the values are right, but {up} bytes went up the bus this step; only the "
            f"updated parameters must: 4 bytes × {owned} elements = {want['host_to_device']} "
            "(not the gradients, not the optimizer state, not twice)."
        )
    if down < want["device_to_host"] or up < want["host_to_device"]:
        return (
            f"the values are right but only {down} bytes went down and {up} up, where the "
            f"step needs {want['device_to_host']} each way: move the data with copy_ between "
            "the device tensors and the host buffers you were given, not through another path."
        )
    return None


def check_offloaded_step(offloaded_step: Callable) -> None:
    """Train FSDP with `offloaded_step(params, masters, host_optimizer)` on N = 2 and 3."""
    reference = _step_reference()
    for world in STEP_WORLDS:
        try:
            results = run_on_world(_step_rank, world, offloaded_step, hang_hint=STEP_HANG_HINT)
        except RankFailedError as exc:
            if "'NoneType' object has no attribute" in str(exc):
                fail(
                    "a step failed on a None: m.grad (or p.grad) was None when your code used "
                    "it. host_optimizer.zero_grad() sets the masters' gradients to None "
                    "(set_to_none=True); there is no need to zero them, every step overwrites "
                    "them with m.grad.copy_(p.grad)."
                )
            if "leaf Variable that requires grad" in str(exc):
                fail(
                    "copying into a parameter in place (p.copy_(m)) is refused by autograd "
                    "outside torch.no_grad(): wrap the copies back in `with torch.no_grad():` "
                    "(or copy into p.data)."
                )
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
