"""Pictures for hash embeddings (notebook 11).

- `plot_probe_chains`: a `HashTable`'s slots in a row, each stored key written in its slot,
  and for a few keys the linear-probing chain from the home slot `fmix64(key) mod slots` to
  where the key sits (wrapping round the end of the table).
- `plot_load_imbalance`: key occurrences (the all-to-all's and the owners' work) and distinct
  keys (the owners' table rows) per rank, under `key mod N` and `fmix64(key) mod N`, with the
  imbalance max / mean in the title (HugeCTR docs, "DistributedSlotSparseEmbeddingHash").
- `plot_bytes_per_step`: bytes each rank sends in one step, measured, per placement, next to
  `theory.distributed_slot_step_bytes`.

Every function returns a matplotlib Figure and shows nothing itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from .distributed import key_owner
from .hash_table import EMPTY_KEY, HashTable, fmix64

PLACEMENT_COLORS = {"modulo": "#c44e52", "hashed": "#4c72b0"}


def probe_chain(table: HashTable, key: int) -> list[int]:
    """The slots linear probing visits for `key`, home slot first, up to where it stops
    (the key's slot, or the empty slot that proves it missing)."""
    mask = table.num_slots - 1
    slot = int(fmix64(torch.tensor([key]))[0]) & mask
    chain = [slot]
    for _ in range(table.num_slots):
        stored = int(table._slot_keys[slot])
        if stored in (key, EMPTY_KEY):
            break
        slot = (slot + 1) & mask
        chain.append(slot)
    return chain


def plot_probe_chains(table: HashTable, keys: Sequence[int], title: str = "") -> Figure:
    n = table.num_slots
    fig, ax = plt.subplots(figsize=(max(6, 0.62 * n), 2.6))
    stored = table._slot_keys[:n].tolist()
    rows = table._slot_rows.tolist()
    colors = plt.get_cmap("tab10")
    owner_of_slot = {}
    for i, key in enumerate(keys):
        chain = probe_chain(table, key)
        owner_of_slot[chain[-1]] = i
        for a, b in zip(chain, chain[1:]):
            rad = -0.15 if b < a else -0.5  # a wrap-around arrow: a flatter arc
            arrow = FancyArrowPatch(
                (a + 0.5, 1.05), (b + 0.5, 1.05), connectionstyle=f"arc3,rad={rad}",
                arrowstyle="-|>", mutation_scale=10, color=colors(i % 10), lw=1.4,
            )  # fmt: skip
            ax.add_patch(arrow)
        ax.plot(chain[0] + 0.5, -0.15, "^", color=colors(i % 10), ms=7)
    for s in range(n):
        used = stored[s] != EMPTY_KEY
        face = "#dddddd" if used else "white"
        if s in owner_of_slot:
            face = colors(owner_of_slot[s] % 10)
        ax.add_patch(Rectangle((s, 0), 1, 1, facecolor=face, edgecolor="black", alpha=0.8))
        if used:
            ax.text(s + 0.5, 0.62, str(stored[s]), ha="center", va="center", fontsize=7)
            ax.text(s + 0.5, 0.28, f"row {rows[s]}", ha="center", va="center", fontsize=6)
        ax.text(s + 0.5, -0.45, str(s), ha="center", va="center", fontsize=7, color="gray")
    ax.set_xlim(-0.2, n + 0.2)
    ax.set_ylim(-0.7, 2.0)
    ax.axis("off")
    ax.set_title(
        title
        or f"{n} slots, {table.size} keys (load {table.load_factor:.2f}): ▲ home slot "
        "fmix64(key) mod slots, arrows: the probes"
    )
    return fig


def keys_per_rank(keys: torch.Tensor, world: int, placement: str) -> tuple[list, list]:
    """(occurrences, distinct keys) each rank owns under `placement`."""
    occ = torch.bincount(key_owner(keys, world, placement), minlength=world).tolist()
    uniq = keys.unique()
    distinct = torch.bincount(key_owner(uniq, world, placement), minlength=world).tolist()
    return occ, distinct


def imbalance(counts: Sequence[int]) -> float:
    """max / mean: 1 is perfectly even, N is everything on one rank."""
    return max(counts) * len(counts) / max(1, sum(counts))


def plot_load_imbalance(keys: torch.Tensor, world: int) -> Figure:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    width = 0.38
    for ax, what in zip(axes, ("key occurrences", "distinct keys (table rows)")):
        parts = []
        for j, placement in enumerate(("modulo", "hashed")):
            occ, distinct = keys_per_rank(keys, world, placement)
            counts = occ if what == "key occurrences" else distinct
            xs = [r + (j - 0.5) * width for r in range(world)]
            label = "key mod N" if placement == "modulo" else "fmix64(key) mod N"
            ax.bar(xs, counts, width, color=PLACEMENT_COLORS[placement], label=label)
            parts.append(f"{label}: {imbalance(counts):.2f}")
        ax.set_xticks(range(world), [f"rank {r}" for r in range(world)])
        ax.set_ylabel(what)
        ax.set_title("max/mean  " + ",  ".join(parts), fontsize=9)
        ax.legend(fontsize=8)
    fig.suptitle(f"Who owns the keys: {keys.numel()} occurrences, Zipf-skewed, N = {world}")
    fig.tight_layout()
    return fig


def plot_bytes_per_step(
    measured: Mapping[str, Sequence[float]], theory: Mapping[str, Sequence[float]]
) -> Figure:
    fig, ax = plt.subplots(figsize=(7, 3.2))
    width = 0.38
    for j, placement in enumerate(measured):
        got, want = measured[placement], theory[placement]
        xs = [r + (j - 0.5) * width for r in range(len(got))]
        ax.bar(
            xs, got, width, color=PLACEMENT_COLORS.get(placement), label=f"{placement}, measured"
        )
        ax.plot(xs, want, "k_", ms=18, mew=2)
    ax.plot([], [], "k_", ms=12, mew=2, label="theory")
    ax.set_xticks(range(len(got)), [f"rank {r}" for r in range(len(got))])
    ax.set_ylabel("bytes sent in one step")
    ax.set_title("Distributed slots: all-to-all bytes per step (forward + backward)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
