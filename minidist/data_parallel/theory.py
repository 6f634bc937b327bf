"""The numbers data parallelism should produce, as functions: defined here once.

Tests, the tour, the checkers and notebook 01 call these instead of retyping a formula.

- Bytes each rank sends per step: one all-reduce of every trainable gradient, which on a
  ring is 2(N-1)/N of the gradient bytes (Patarasuk & Yuan 2009), whether it travels in one
  call per parameter (naive) or one per bucket (DDP).
- Model-state memory per rank: every rank holds everything, whatever N is (Rajbhandari et
  al. 2020, "ZeRO", section 3: the Kψ bytes of optimizer state are replicated N times).
"""

from __future__ import annotations

from .. import comm

# Optimizer state bytes per parameter in float32 (SGD with momentum: one buffer; Adam: two).
OPTIMIZER_STATE_BYTES = {"sgd": 4, "adam": 8}


def bytes_sent_per_step(psi: int, world_size: int, bytes_per_grad: int = 4) -> float:
    """Bytes one rank sends per step for Ψ trainable parameters: 2(N-1)/N · Ψ · bytes."""
    return comm.ring_bytes("all_reduce", psi * bytes_per_grad, world_size)


def model_state_bytes_per_rank(
    n_params: int, psi: int, optimizer: str = "sgd", n_state_tensors: int = 0
) -> int:
    """Parameters (4 bytes each of `n_params`, frozen included), gradients and optimizer
    state (of the Ψ trainable ones) one replica holds, in float32.

    Adam also keeps a 4-byte step counter per parameter tensor (`n_state_tensors`).
    With SGD + momentum and no frozen parameters that is 12Ψ; with Adam 16Ψ (+ counters).
    """
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ValueError(
            f"optimizer must be one of {sorted(OPTIMIZER_STATE_BYTES)}, got {optimizer!r}"
        )
    counters = 4 * n_state_tensors if optimizer == "adam" else 0
    return 4 * n_params + 4 * psi + OPTIMIZER_STATE_BYTES[optimizer] * psi + counters
