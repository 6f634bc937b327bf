"""Key-sorted state dicts of hash embeddings and their sparse optimizers' state.

The in-memory half of `minidist.embedding.checkpoint` (which writes and reads files). A
hash embedding's rows are numbered in the order keys were first claimed, which depends on
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
  tests/test_embedding_checkpoint.py);
- `_merge`: the shards of several saved ranks cut to the keys one rank owns (a load on
  another world), refusing a key saved twice or counters that differ between ranks.
"""

from __future__ import annotations

import torch

from ..checkpoint_files import CheckpointError
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
        keys=keys.clone(),
        vectors=local.weight.detach()[rows].clone(),
        optimizer={name: t.detach()[rows].clone() for name, t in table_states.items()},
        optimizer_other={k: (v.clone() if torch.is_tensor(v) else v) for k, v in other.items()},
        dim=local.dim,
        mode=layer.mode,
    )


def load_embedding_state_dict(layer, optimizer, state: dict) -> None:
    """Load `state` (from `embedding_state_dict`) into a fresh layer and its optimizer."""
    who = "load_embedding_state_dict"
    local = _local(layer)
    if local.table.size:
        raise ValueError(
            f"{who}: layer already holds {local.table.size} keys; load into a fresh layer"
        )
    if state["dim"] != local.dim or state["mode"] != layer.mode:
        raise ValueError(
            f"{who}: state has dim={state['dim']}, mode={state['mode']!r}; the layer has "
            f"dim={local.dim}, mode={layer.mode!r}"
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


def _tensors(state: dict) -> dict[str, torch.Tensor]:
    named = {"keys": state["keys"], "vectors": state["vectors"]}
    named.update({f"optimizer.{k}": v for k, v in state["optimizer"].items()})
    return named


def _merge(states: list[dict], mine, who: str) -> dict:
    """The saved shards' keys that this rank owns, in key order, with their rows."""
    parts = []
    for state in states:
        keep = mine(state["keys"])
        parts.append({name: t[keep] for name, t in _tensors(state).items()})
    merged = {name: torch.cat([p[name] for p in parts]) for name in parts[0]}
    order = torch.argsort(merged["keys"])
    merged = {name: t[order] for name, t in merged.items()}
    keys = merged["keys"]
    if keys.numel() > 1 and bool((keys[1:] == keys[:-1]).any()):
        dup = int(keys[1:][keys[1:] == keys[:-1]][0])
        raise CheckpointError(f"{who}: key {dup} is in more than one rank's file")
    others = [s["optimizer_other"] for s in states]
    for other in others[1:]:
        if other.keys() != others[0].keys() or any(
            not torch.equal(torch.as_tensor(other[k]), torch.as_tensor(others[0][k])) for k in other
        ):
            raise CheckpointError(
                f"{who}: the ranks saved different optimizer counters ({others[0]} vs {other})"
            )
    return dict(
        keys=merged["keys"],
        vectors=merged["vectors"],
        optimizer={k[len("optimizer.") :]: v for k, v in merged.items() if k.startswith("opt")},
        optimizer_other=others[0],
        dim=states[0]["dim"],
        mode=states[0]["mode"],
    )
