"""A sharded checkpoint read whole in one process: the single-process model's state dict.

`load_full` of `minidist.fsdp.checkpoint`. Zhao et al. 2023, "PyTorch FSDP" (VLDB), on
state dicts: a full state dict is the whole model under its original names, what one
process (evaluation, export, another parallel layout) loads. Here it is gathered from a
sharded checkpoint after the fact, with no process group: DCP's `no_dist` read of every
entry whole, each flat unit cut back into its parameters by the layout record
(`checkpoint_layout.py`), tied names pointing at one tensor. Since the result names
parameters, not units, it loads into any unit grouping (another `wrap` policy or bucket
size, FSDP <-> ZeRO) through the plain model.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from .checkpoint_check import _read
from .checkpoint_safe import dcp_load


def _placeholder(md):
    """A destination for one checkpoint entry read whole (DCP fills tensors in place)."""
    if isinstance(md, TensorStorageMetadata):
        return torch.empty(md.size, dtype=md.properties.dtype, device="cpu")
    return None


# -- load_full ------------------------------------------------------------------------------------
def load_full(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict]:
    """Read a checkpoint whole in one process (no process group needed).

    Returns (model state dict, optimizer state): the first is the single-process model's
    `state_dict()` (tied names share one tensor), ready for `model.load_state_dict`; the
    second is keyed by parameter names, `{"state": {name: {...}}, "param_groups": [{...,
    "params": [names]}]}` (torch's `get_optimizer_state_dict` format), or None when the
    checkpoint has no optimizer.
    """
    pinned, meta, layout = _read(Path(path))
    with pinned:  # one version, verified, whatever a save does meanwhile
        dest = {k: _placeholder(md) for k, md in meta.state_dict_metadata.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp_load(dest, pinned, no_dist=True)

    def unflatten(flat: torch.Tensor, unit: dict) -> dict[str, torch.Tensor]:
        out, offset = {}, 0
        for name, shape in zip(unit["names"], unit["shapes"]):
            n = int(torch.Size(shape).numel())
            out[name] = flat[offset : offset + n].view(shape).clone()
            offset += n
        return out

    model_state: dict[str, torch.Tensor] = {}
    for k, v in dest.items():
        if k.startswith("model.") and not k.startswith("model.flat["):
            model_state[k[len("model.") :]] = v
    for unit in layout["units"]:
        model_state.update(unflatten(dest[f"model.{unit['key']}"], unit))
    for alias, name in layout["aliases"].items():
        model_state[alias] = model_state[name]
    opt = layout["optimizer"]
    if opt is None:
        return model_state, None
    units = {u["key"]: u for u in layout["units"]}
    state: dict[str, dict] = {}
    for key, kinds in opt["state"].items():
        unit = units[key]
        per_param = {n: {} for n in unit["names"]}
        for name, kind in kinds.items():
            value = dest[f"optim.{key}.{name}"]
            if kind == "sharded":
                for n, t in unflatten(value, unit).items():
                    per_param[n][name] = t
            else:
                for n in unit["names"]:
                    per_param[n][name] = value.clone() if kind == "tensor" else value
        state.update(per_param)
    groups = []
    for g, keys in enumerate(opt["groups"]):
        prefix = f"optim.param_groups.{g}."
        hyper = {k[len(prefix) :]: v for k, v in dest.items() if k.startswith(prefix)}
        groups.append({**hyper, "params": [n for key in keys for n in units[key]["names"]]})
    return model_state, {"state": state, "param_groups": groups}
