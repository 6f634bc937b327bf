"""What offloading should cost, as functions: bytes per tier and bytes moved per step.

Ren et al. 2021, "ZeRO-Offload: Democratizing Billion-Scale Model Training" (USENIX ATC),
section 3: training with mixed-precision Adam is a data-flow graph of states (fp16
parameters and gradients, 2Ψ bytes each; fp32 master parameters, momentum and variance, 4Ψ
each) and computations (forward and backward, O(Ψ·batch); the update, O(Ψ)). Forward and
backward stay on the GPU; any cut that moves something off it crosses at least the fp16
gradients (down) and the fp16 parameters (up): 4Ψ bytes over the bus per step, the minimum.
Putting the update with all its fp32 states and the fp16 gradients on the CPU reaches that
minimum and leaves the GPU only the 2Ψ of fp16 parameters (`placement_options`). Section 4:
with data parallelism each rank offloads only its own partition (its 1/N).
Rajbhandari et al. 2021, "ZeRO-Infinity: Breaking the GPU Memory Wall for Extreme Scale Deep
Learning" (SC21): the same states one tier lower, on NVMe; here memory-mapped files.

Placements of `minidist.offload.OffloadOptimizer` on the chunks a rank owns ("device": no
offload, "cpu", "disk"), in this course's fp32: the device keeps parameters (4 bytes) and
gradients (4); the host keeps fp32 masters (4), their gradients (4) and Adam's two moments
(8), or, on the disk tier, the moments live in files. Per step the gradients go down and the
updated parameters come back: 4 + 4 bytes per owned element in fp32, 2 + 2 (ZeRO-Offload's
4Ψ) with fp16 or bf16 on the device.
"""

from __future__ import annotations

PLACEMENTS = ("device", "cpu", "disk")  # where Adam runs and keeps its state
TIERS = ("device", "host", "disk")  # where bytes can live
STATES = ("params", "grads", "optimizer")  # the three kinds of model state (ZeRO 3.1)
ADAM_STATE_BYTES = 8  # momentum + variance, fp32
STEP_COUNTER_BYTES = 4  # Adam's step count: a float32 scalar tensor per stepped tensor


def _check(owned: int, placement: str) -> None:
    if owned < 0:
        raise ValueError(f"owned must be >= 0, got {owned}")
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")


def tier_bytes(
    owned: int,
    placement: str,
    tensors: int = 0,
    frozen: int = 0,
    param_bytes: int = 4,
    grad_bytes: int = 4,
) -> dict[str, dict[str, int]]:
    """Bytes of model state one rank keeps in each tier after a step, by kind of state.

    `owned`: trainable elements this rank steps (its padded chunks), in `tensors` tensors
    (Adam keeps one 4-byte step counter per tensor); `frozen`: frozen parameter elements,
    kept on the device. `param_bytes` / `grad_bytes`: the device's dtypes (4 in fp32, 2 in
    mixed precision, where the device-placed optimizer also keeps a 4-byte master copy).

    device: everything on the device. cpu: the device keeps parameters and gradients; the
    host keeps fp32 masters, their fp32 gradients, the moments and the counters. disk: as
    cpu, but the moments are in files.
    """
    _check(owned, placement)
    on_device = {"params": param_bytes * (owned + frozen), "grads": grad_bytes * owned}
    counters = STEP_COUNTER_BYTES * tensors
    moments = ADAM_STATE_BYTES * owned
    out = {tier: dict.fromkeys(STATES, 0) for tier in TIERS}
    out["device"].update(on_device)
    if placement == "device":
        master = 4 * owned if param_bytes != 4 else 0  # fp32 training: params are the masters
        out["device"]["optimizer"] = master + moments + counters
        return out
    out["host"].update(params=4 * owned, grads=4 * owned, optimizer=counters)
    if placement == "cpu":
        out["host"]["optimizer"] += moments
    else:
        out["disk"]["optimizer"] = moments
    return out


def totals(by_tier: dict[str, dict[str, int]]) -> dict[str, int]:
    """{tier: bytes} from `tier_bytes`' {tier: {state: bytes}} (or a measurement like it)."""
    return {tier: sum(states.values()) for tier, states in by_tier.items()}


def bytes_moved_per_step(owned: int, param_bytes: int = 4, grad_bytes: int = 4) -> dict[str, int]:
    """Bytes over the bus between device and host per step, for `owned` elements offloaded:
    every gradient down, every updated parameter back up, in the device's dtypes.

    fp32: 4 + 4 bytes per element. fp16/bf16: 2 + 2, ZeRO-Offload's 4Ψ (section 3), per rank
    4Ψ/N with its partition of Ψ/N (section 4). Nothing moves when nothing is offloaded.
    """
    if owned < 0:
        raise ValueError(f"owned must be >= 0, got {owned}")
    return {"device_to_host": grad_bytes * owned, "host_to_device": param_bytes * owned}


def disk_bytes_per_step(owned: int) -> dict[str, int]:
    """Bytes of optimizer state the disk tier serves per step: Adam reads both moments of
    every owned element and writes them back (ZeRO-Infinity's NVMe traffic). With
    memory-mapped files the operating system's page cache decides when they reach the disk."""
    if owned < 0:
        raise ValueError(f"owned must be >= 0, got {owned}")
    moments = ADAM_STATE_BYTES * owned
    return {"disk_to_host": moments, "host_to_disk": moments}


# -- ZeRO-Offload section 3: where should each state of mixed-precision Adam live? ----------

MIXED_PRECISION_STATES = {"p16": 2, "g16": 2, "p32": 4, "m32": 4, "v32": 4}  # bytes/param
# Each computation and the states it reads and writes. Forward and backward both read the
# fp16 parameters; the update reads the gradients and the fp32 states and writes the fp32
# states and the new fp16 parameters (ZeRO-Offload's "float2half").
COMPUTATIONS = {
    "forward": (("p16",), ()),
    "backward": (("p16",), ("g16",)),
    "update": (("g16", "p32", "m32", "v32"), ("p32", "m32", "v32", "p16")),
}
# (what it is, the states kept on the CPU, where forward/backward run, where the update runs)
OPTIONS = (
    ("everything on the GPU", (), "gpu", "gpu"),
    ("Adam's moments on the CPU, update on the GPU", ("m32", "v32"), "gpu", "gpu"),
    ("fp32 states and update on the CPU", ("p32", "m32", "v32"), "gpu", "cpu"),
    ("+ fp16 gradients on the CPU (ZeRO-Offload)", ("g16", "p32", "m32", "v32"), "gpu", "cpu"),
    ("+ fp16 parameters on the CPU", ("p16", "g16", "p32", "m32", "v32"), "gpu", "cpu"),
    ("everything on the CPU", ("p16", "g16", "p32", "m32", "v32"), "cpu", "cpu"),
)


def bus_bytes_per_param(on_cpu, fwd_bwd_on: str = "gpu", update_on: str = "gpu") -> int:
    """Bytes per parameter crossing the bus per step: every state a computation reads or
    writes where it does not live moves once for each such read and each such write."""
    where = {s: ("cpu" if s in on_cpu else "gpu") for s in MIXED_PRECISION_STATES}
    side = {"forward": fwd_bwd_on, "backward": fwd_bwd_on, "update": update_on}
    moved = 0
    for comp, (reads, writes) in COMPUTATIONS.items():
        for s in (*reads, *writes):
            if where[s] != side[comp]:
                moved += MIXED_PRECISION_STATES[s]
    return moved


def placement_options(num_params: float) -> list[dict]:
    """The candidate placements of mixed-precision Adam for Ψ = `num_params` (ZeRO-Offload
    section 3): bytes on the GPU, on the CPU, over the bus per step, where compute runs."""
    rows = []
    for label, on_cpu, fwd_bwd_on, update_on in OPTIONS:
        gpu = sum(b for s, b in MIXED_PRECISION_STATES.items() if s not in on_cpu)
        rows.append(
            {
                "placement": label,
                "on_cpu": on_cpu,
                "forward_backward": fwd_bwd_on,
                "update": update_on,
                "gpu_bytes": gpu * num_params,
                "cpu_bytes": (sum(MIXED_PRECISION_STATES.values()) - gpu) * num_params,
                "bus_bytes": bus_bytes_per_param(on_cpu, fwd_bwd_on, update_on) * num_params,
            }
        )
    return rows
