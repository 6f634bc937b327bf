"""What ZeRO should cost, as functions: memory per device and bytes per step, defined once.

Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", section 3.1 (model states: with mixed-precision Adam 2Ψ fp16 parameters + 2Ψ fp16
gradients + KΨ optimizer states, K = 12 for the fp32 master copy, momentum and variance) and
section 5 (stage 1 partitions the optimizer states, stage 2 also the gradients, stage 3 also
the parameters), Figure 1 (Ψ = 7.5B, N = 64: 120 / 31.4 / 16.6 / 1.9 GB), section 7
(communication: stages 1-2 move what DP's all-reduce moves, 2Ψ; stage 3 moves 3Ψ).

Stage 0 is plain data parallelism. The same functions give the fp32 numbers the CPU tests
measure: parameters 4 bytes, gradients 4 bytes, Adam's two moments K = 8 (fp32 training
needs no separate master copy).
"""

from __future__ import annotations

from collections.abc import Iterable

from .. import comm

STAGES = (0, 1, 2, 3)


def _check(num_params: int, world_size: int, stage: int) -> None:
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage}")
    if num_params < 0:
        raise ValueError(f"num_params must be >= 0, got {num_params}")


def memory_per_device(
    num_params: float,
    world_size: int,
    stage: int,
    k: float = 12,
    param_bytes: float = 2,
    grad_bytes: float = 2,
) -> float:
    """Bytes of model states per device (ZeRO section 5; mixed-precision Adam by default).

    stage 0: (2 + 2 + K)Ψ,  1: (2 + 2)Ψ + KΨ/N,  2: 2Ψ + (2 + K)Ψ/N,  3: (2 + 2 + K)Ψ/N.
    """
    _check(num_params, world_size, stage)
    psi, n = num_params, world_size
    p, g = param_bytes * psi, grad_bytes * psi
    o = k * psi
    return {0: p + g + o, 1: p + g + o / n, 2: p + (g + o) / n, 3: (p + g + o) / n}[stage]


def fp32_adam_bytes(num_params: float, world_size: int, stage: int) -> dict[str, float]:
    """Parameters, gradients and Adam moments per device in fp32 (4 + 4 + 8 bytes each)."""
    _check(num_params, world_size, stage)
    n = world_size
    return {
        "params": 4 * num_params / (n if stage >= 3 else 1),
        "grads": 4 * num_params / (n if stage >= 2 else 1),
        "optimizer": 8 * num_params / (n if stage >= 1 else 1),
    }


def padded_numel(numels: Iterable[int], world_size: int) -> int:
    """Elements after padding each flat unit (bucket) to a multiple of N (≤ N-1 each)."""
    return sum(-(-n // world_size) * world_size for n in numels)


def bytes_sent_per_step(
    num_elements: int,
    world_size: int,
    stage: int,
    reshard_after_forward: bool = True,
    element_size: int = 4,
) -> float:
    """Bytes one rank sends per step on a ring, for `num_elements` (padded) trainable elements.

    Stage 0: one all-reduce, 2(N-1)/N·Ψ. Stages 1-2: reduce-scatter of gradients plus
    all-gather of updated parameters, (N-1)/N·Ψ each, the same 2(N-1)/N·Ψ. Stage 3: an
    all-gather in forward, another in backward when parameters were freed after forward,
    and the reduce-scatter: 3(N-1)/N·Ψ, or 2(N-1)/N·Ψ without resharding.
    """
    _check(num_elements, world_size, stage)
    size = num_elements * element_size
    if stage == 0:
        return comm.ring_bytes("all_reduce", size, world_size)
    gathers = 2 if stage == 3 and reshard_after_forward else 1
    return (gathers + 1) * comm.ring_bytes("all_gather", size, world_size)


def paper_table(num_params: float = 7.5e9, world_sizes=(64,), k: float = 12) -> list[dict]:
    """Rows of ZeRO's Figure 1 / Table 1: GB per device per stage (1 GB = 1e9 bytes)."""
    return [
        {"N": n, **{f"stage {s}": memory_per_device(num_params, n, s, k) / 1e9 for s in STAGES}}
        for n in world_sizes
    ]


def fp32_adam_rank_bytes(
    num_params: int, world_size: int, stage: int, frozen: int = 0, adam_steps: int = 0
) -> dict[str, float]:
    """`fp32_adam_bytes` plus the two small terms a real rank of stages 0-2 also holds.

    Frozen parameters (4 bytes each) are kept whole on every rank; Adam keeps a 4-byte step
    counter per tensor it steps: one per parameter in stage 0, one per flat bucket shard in
    stages 1-2. These are the numbers `minidist.memory.model_state_bytes` measures exactly.
    """
    if stage == 3:
        raise ValueError("fp32_adam_rank_bytes: stages 0-2 only (stage 3 shards parameters too)")
    out = fp32_adam_bytes(num_params, world_size, stage)
    out["params"] += 4 * frozen
    out["optimizer"] += 4 * adam_steps
    return out


def peak_bytes(weights: float, aux: float, working: float, world_size: int, sharded: bool) -> float:
    """Peak memory of a training step (Xu et al. 2020, weight-update sharding).

    `weights` W, the optimizer's auxiliary variables `aux` V (Adam's moments), and the peak
    `working` set P of forward and backward (activations, gradients, temporaries).
    Replicated: W + V + P. Sharded: only V/N is live during forward and backward; where the
    whole V must exist at all (handed back whole at the end of a step) it exists when P does
    not, so the peak is max(W + V/N + P, W + V).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not sharded:
        return weights + aux + working
    return max(weights + aux / world_size + working, weights + aux)
