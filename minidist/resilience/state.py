"""The training state beyond the tensors: step, data position, loss scaler, RNG streams.

What a run needs, besides parameters and optimizer state, to go on as if it never stopped
(the issue's list; torchtitan's `CheckpointManager` keeps the same, its data loader's
position aside, torchtitan #811):

- `step`: optimizer steps taken;
- `samples`: the *global* sample index, the first sample the next step trains on. A
  per-rank iterator position depends on the dp degree (rank r of d reads samples r, r+d,
  ...); the global index does not, so a run saved on dp=4 resumes on dp=2 at the right
  batch (`local_batch`);
- the loss scaler (`DynamicLossScaler`: scale, good steps in a row, skipped in a row);
- every rank's random streams: the default CPU generator (CUDA's where initialised) and
  each tensor-parallel dropout stream (`TensorParallelRNG`, Megatron-LM's tracker). These
  are per rank, so they resume bit for bit only on the same layout; on another one a rank
  keeps the streams it was seeded with (`LoadReport.rng_restored` says which).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ..megatron.layers import TensorParallelRNG

_SCALER_FIELDS = ("scale_value", "good_steps", "skipped_in_a_row")


@dataclass
class TrainingState:
    """Everything but the tensors' pieces; `rng` is this rank's streams (name -> state)."""

    step: int = 0
    samples: int = 0
    scaler: dict | None = None
    rng: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("step", "samples"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"TrainingState: {name}={value!r} must be an int >= 0")
        for name, t in self.rng.items():
            if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.dim() != 1:
                raise ValueError(f"TrainingState: rng[{name!r}] must be a 1-D uint8 tensor")


def capture_rng(model: nn.Module | None = None) -> dict[str, torch.Tensor]:
    """This rank's random streams: the CPU generator's, CUDA's (when initialised) and every
    `TensorParallelRNG` inside `model` (keyed by its module's name)."""
    streams = {"torch.cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        streams["torch.cuda"] = torch.cuda.get_rng_state()
    for name, module in model.named_modules() if model is not None else ():
        rng = getattr(module, "rng", None)
        if isinstance(rng, TensorParallelRNG):
            streams[f"{name}.rng"] = rng.state.clone()
    return streams


def restore_rng(streams: dict[str, torch.Tensor], model: nn.Module | None = None) -> None:
    """Set the streams `capture_rng` returned; a stream this rank does not have is refused."""
    mine = capture_rng(model)
    if set(streams) != set(mine):
        raise ValueError(
            f"restore_rng: the saved streams {sorted(streams)} are not this rank's {sorted(mine)}"
        )
    torch.set_rng_state(streams["torch.cpu"])
    if "torch.cuda" in streams:
        torch.cuda.set_rng_state(streams["torch.cuda"])
    modules = dict(model.named_modules()) if model is not None else {}
    for name, state in streams.items():
        if name.endswith(".rng") and name[: -len(".rng")] in modules:
            modules[name[: -len(".rng")]].rng.state = state.clone()


def scaler_state(scaler) -> dict | None:
    """A `DynamicLossScaler`'s state as plain numbers (None for no scaler)."""
    return None if scaler is None else {k: getattr(scaler, k) for k in _SCALER_FIELDS}


def restore_scaler(scaler, state: dict | None) -> None:
    if (scaler is None) != (state is None):
        raise ValueError(
            f"restore_scaler: the checkpoint {'has no' if state is None else 'has a'} loss "
            f"scaler, the run {'has one' if scaler is not None else 'has none'}"
        )
    if scaler is not None:
        for k in _SCALER_FIELDS:
            setattr(scaler, k, type(getattr(scaler, k))(state[k]))


def local_batch(samples: int, global_batch: int, rank: int, world: int) -> range:
    """The global sample indices a dp rank trains on in the step that starts at `samples`:
    its contiguous 1/world of the global batch (`minidist.data.shard_batch`'s split)."""
    if global_batch % world:
        raise ValueError(f"local_batch: global_batch={global_batch} not divisible by {world}")
    per = global_batch // world
    return range(samples + rank * per, samples + (rank + 1) * per)
