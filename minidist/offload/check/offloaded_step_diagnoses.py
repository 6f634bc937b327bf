"""offload checker: exercise 1, the diagnoses: the message naming each mistake in the learner's
offloaded step (Ren et al. 2021, "ZeRO-Offload", sections 3-4), read from what
`offloaded_step._step_rank` measured on every rank and step (the copies on the bus, what
`m.grad` held when the host optimizer stepped, the values after the step), and from the
exception a rank raised.
"""

from __future__ import annotations

from ...runtime import RankFailedError
from .. import theory


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


def _diagnose_rank_failure(exc: RankFailedError) -> str | None:
    """The mistake a rank's exception names, or None for one this checker does not know."""
    if "'NoneType' object has no attribute" in str(exc):
        return (
            "a step failed on a None: m.grad (or p.grad) was None when your code used "
            "it. host_optimizer.zero_grad() sets the masters' gradients to None "
            "(set_to_none=True); there is no need to zero them, every step overwrites "
            "them with m.grad.copy_(p.grad)."
        )
    if "leaf Variable that requires grad" in str(exc):
        return (
            "copying into a parameter in place (p.copy_(m)) is refused by autograd "
            "outside torch.no_grad(): wrap the copies back in `with torch.no_grad():` "
            "(or copy into p.data)."
        )
    return None
