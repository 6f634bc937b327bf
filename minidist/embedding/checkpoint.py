"""Key-sorted save and load of hash embeddings and their sparse optimizers' state.

A hash embedding's rows are numbered in the order keys were first claimed, which depends on
the back end, the batch order and the placement; the portable form of the table is the map
key -> (vector, optimizer state). HugeCTR saves a sparse model that way (NVIDIA Merlin
HugeCTR docs, "Embedding Training Cache" and `Model::save_params_to_files`: a `key` file
and an `emb_vector` file per table, and the optimizer's per-key states beside them), and so
does this module:

- `embedding_state_dict(layer, optimizer)`: the keys sorted ascending, their vectors, and
  for every optimizer state shaped like the table (momentum, accumulator, moments) its rows
  in the same key order, plus the optimizer's other state (Adam's step count) as is;
- `load_embedding_state_dict(layer, optimizer, state)`: into a *fresh* layer (an empty
  table): the keys are inserted in key order, vectors and states written to their new rows.
  Training then continues exactly as it would have: every computation is per row and per
  occurrence in input order, so the row numbers do not enter the results (bitwise equal,
  tests/test_embedding_checkpoint.py).

The distributed layers (`distributed.py`) hold one shard per rank: each rank saves and loads
its own `layer.local` (rank r's file in `save`/`load`), on the same world and placement.
Not done here: loading onto another world size (a re-shard by `key_owner`), incremental
dumps of the rows touched since the last save (HugeCTR's ETC), torch.distributed.checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .layers import HashEmbeddingBag


def _local(layer) -> HashEmbeddingBag:
    """The HashEmbeddingBag that holds this rank's keys (the layer itself, or its shard)."""
    local = getattr(layer, "local", layer)
    if not isinstance(local, HashEmbeddingBag):
        raise TypeError(
            f"layer must be a HashEmbeddingBag or a slot embedding, got {type(layer).__name__}"
        )
    return local


def _table_states(optimizer, weight) -> tuple[dict, dict]:
    """(states shaped like the table, other states) of `weight` in `optimizer`."""
    if optimizer is None:
        return {}, {}
    state = optimizer.state.get(weight, {})
    rows = {k: v for k, v in state.items() if torch.is_tensor(v) and v.shape == weight.shape}
    other = {k: v for k, v in state.items() if k not in rows}
    return rows, other


def embedding_state_dict(layer, optimizer=None) -> dict:
    """{keys, vectors, optimizer: {name: rows in key order}, optimizer_other, dim, mode}."""
    local = _local(layer)
    keys, rows = local.table.items()
    table_states, other = _table_states(optimizer, local.weight)
    return dict(
        keys=keys.clone(), vectors=local.weight.detach()[rows].clone(),
        optimizer={name: t.detach()[rows].clone() for name, t in table_states.items()},
        optimizer_other={k: (v.clone() if torch.is_tensor(v) else v) for k, v in other.items()},
        dim=local.dim, mode=local.mode,
    )  # fmt: skip


def load_embedding_state_dict(layer, optimizer, state: dict) -> None:
    """Load `state` (from `embedding_state_dict`) into a fresh layer and its optimizer."""
    who = "load_embedding_state_dict"
    local = _local(layer)
    if local.table.size:
        raise ValueError(
            f"{who}: layer already holds {local.table.size} keys; load into a fresh layer"
        )
    if state["dim"] != local.dim or state["mode"] != local.mode:
        raise ValueError(
            f"{who}: state has dim={state['dim']}, mode={state['mode']!r}; the layer has "
            f"dim={local.dim}, mode={local.mode!r}"
        )
    table_states, _ = _table_states(optimizer, local.weight)
    if set(state["optimizer"]) != set(table_states):
        raise ValueError(
            f"{who}: state holds optimizer states {sorted(state['optimizer'])}, the optimizer "
            f"has {sorted(table_states)}"
        )
    rows = local.table.insert(state["keys"])  # raises HashTableFullError before any change
    with torch.no_grad():
        local.weight[rows] = state["vectors"].to(local.weight.device)
        for name, saved in state["optimizer"].items():
            table_states[name][rows] = saved.to(local.weight.device)
    if optimizer is not None:
        optimizer.state[local.weight].update(state["optimizer_other"])


def rank_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"embedding_rank{rank}.pt"


def save(layer, optimizer, directory: str | Path, rank: int = 0) -> Path:
    """Write this rank's key-sorted state to `directory/embedding_rank{rank}.pt`."""
    path = rank_path(directory, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(embedding_state_dict(layer, optimizer), path)
    return path


def load(layer, optimizer, directory: str | Path, rank: int = 0) -> None:
    """Read this rank's state from `directory/embedding_rank{rank}.pt` into a fresh layer."""
    path = rank_path(directory, rank)
    if not path.exists():
        raise FileNotFoundError(f"load: no embedding state for rank {rank} at {path}")
    load_embedding_state_dict(layer, optimizer, torch.load(path, weights_only=True))
