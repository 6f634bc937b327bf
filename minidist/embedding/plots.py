"""Pictures for hash embeddings (notebook 11).

- `plot_probe_chains`: a `HashTable`'s slots in a row, each stored key written in its slot
  (`key_label`: a large power of two as 2^k, a long key smaller or rounded), and for a few
  keys the linear-probing chain from the home slot `fmix64(key) mod slots` to where the key
  sits (wrapping round the end of the table).
- `plot_load_imbalance`: key occurrences (the all-to-all's and the owners' work) and distinct
  keys (the owners' table rows) per rank, under `key mod N` and `fmix64(key) mod N`, with the
  imbalance max / mean in the title (HugeCTR docs, "DistributedSlotSparseEmbeddingHash").
- `plot_bytes_per_step`: bytes each rank sends in one step, measured, per placement (or per
  scheme), next to the theory (`theory.distributed_slot_reduce_scatter_step_bytes` or
  `theory.distributed_slot_step_bytes`).
- `plot_sort_dedup`: the backward's worked example: the occurrences' rows, the stable sort
  (an arrow from each occurrence to its sorted place), the runs of equal rows with their
  offsets and one gradient sum per unique row (`backward.sort_and_dedup`).
- `plot_placements`: who sends what to whom in one forward of each placement, for given
  counts: (key, bag) pairs out and partial sums of the receiver's bags back through the
  reduce-scatter (distributed, HugeCTR's scheme) or key occurrences out and vectors back
  (distributed, `scheme="all_to_all"`), bags out and pooled vectors back (localized), with
  the bytes of each message.
- `plot_ctr_losses`: loss curves of the CTR models (the hash model against its dense
  baseline), AUC in the legend.

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
    slot = int(fmix64(torch.tensor([key], device="cpu"))[0]) & mask
    chain = [slot]
    for _ in range(table.num_slots):
        stored = int(table._slot_keys[slot])
        if stored in (key, EMPTY_KEY):
            break
        slot = (slot + 1) & mask
        chain.append(slot)
    return chain


def key_label(key: int) -> tuple[str, float]:
    """A stored key as its slot shows it, and its font size, so that it fits its slot: a
    large power of two as 2^k, a key of up to 10 characters in full (smaller the longer it
    is), a longer one rounded (≈1.1e+13)."""
    magnitude = abs(key)
    if magnitude >= 1 << 16 and magnitude & (magnitude - 1) == 0:
        sign = "-" if key < 0 else ""
        return f"${sign}2^{{{magnitude.bit_length() - 1}}}$", 8.0
    text = str(key)
    if len(text) <= 10:
        return text, min(7.0, 42.0 / len(text))
    return f"≈{key:.1e}", 5.0


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
                (a + 0.5, 1.05),
                (b + 0.5, 1.05),
                connectionstyle=f"arc3,rad={rad}",
                arrowstyle="-|>",
                mutation_scale=10,
                color=colors(i % 10),
                lw=1.4,
            )
            ax.add_patch(arrow)
        ax.plot(chain[0] + 0.5, -0.15, "^", color=colors(i % 10), ms=7)
    for s in range(n):
        used = stored[s] != EMPTY_KEY
        face = "#dddddd" if used else "white"
        if s in owner_of_slot:
            face = colors(owner_of_slot[s] % 10)
        ax.add_patch(Rectangle((s, 0), 1, 1, facecolor=face, edgecolor="black", alpha=0.8))
        if used:
            label, size = key_label(stored[s])
            ax.text(s + 0.5, 0.62, label, ha="center", va="center", fontsize=size)
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
    measured: Mapping[str, Sequence[float]],
    theory: Mapping[str, Sequence[float]],
    title: str = "Distributed slots, reduce-scatter scheme: bytes per step (forward + backward)",
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
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_sort_dedup(rows, order, unique_rows, run_offsets) -> Figure:
    rows, order = list(map(int, rows)), list(map(int, order))
    unique_rows, run_offsets = list(map(int, unique_rows)), list(map(int, run_offsets))
    n = len(rows)
    colors = plt.get_cmap("tab10")
    color = {r: colors(i % 10) for i, r in enumerate(unique_rows)}
    fig, ax = plt.subplots(figsize=(max(6, 0.75 * n), 3.6))
    top, mid = 2.6, 1.0
    for i, r in enumerate(rows):  # the occurrences, in batch order
        ax.add_patch(Rectangle((i, top), 0.9, 0.7, facecolor=color[r], alpha=0.55))
        ax.text(i + 0.45, top + 0.35, str(r), ha="center", va="center")
        ax.text(i + 0.45, top + 0.9, f"i={i}", ha="center", fontsize=7, color="gray")
    for j, i in enumerate(order):  # stable sort: occurrence i goes to place j
        ax.annotate(
            "",
            (j + 0.45, mid + 0.72),
            (i + 0.45, top - 0.02),
            arrowprops=dict(arrowstyle="-|>", color=color[rows[i]], lw=1),
        )
        ax.add_patch(Rectangle((j, mid), 0.9, 0.7, facecolor=color[rows[i]], alpha=0.55))
        ax.text(j + 0.45, mid + 0.35, str(rows[i]), ha="center", va="center")
    for u, (a, b) in enumerate(zip(run_offsets, run_offsets[1:])):
        ax.plot([a + 0.02, b - 0.12], [mid - 0.15] * 2, color=color[unique_rows[u]], lw=3)
        ax.text(
            (a + b - 0.1) / 2,
            mid - 0.6,
            f"row {unique_rows[u]}\nΣ of {b - a}",
            ha="center",
            va="center",
            fontsize=7,
        )
    for a in run_offsets:
        ax.text(a - 0.05, mid - 1.15, str(a), ha="center", fontsize=8, color="black")
    ax.text(-0.3, top + 0.35, "rows", ha="right", va="center")
    ax.text(-0.3, mid + 0.35, "sorted", ha="right", va="center")
    ax.text(-0.3, mid - 1.15, "run_offsets", ha="right", fontsize=8)
    ax.set_xlim(-1.6, n + 0.2)
    ax.set_ylim(-0.4, top + 1.2)
    ax.axis("off")
    ax.set_title(
        f"Backward: stable sort by row, {len(unique_rows)} runs of equal rows, one "
        "gradient sum per unique row"
    )
    return fig


def plot_placements(
    distributed: Sequence[Sequence[int]],
    bags: Sequence[Sequence[int]],
    keys: Sequence[Sequence[int]],
    dim: int,
    scheme: str = "reduce_scatter",
) -> Figure:
    """`distributed[r][q]`: key occurrences rank r sends to owner q (distributed slots);
    `bags[r][q]`, `keys[r][q]`: bags and their keys rank r sends to slot owner q (localized;
    rank r's batch has Σ_q bags[r][q] bags). Each arrow r -> q is labelled, naming both ranks
    (the arrows cross), with what goes out
    (int64 keys, and for the reduce-scatter scheme each key's global bag) and what comes back
    (float32 vectors of `dim`: for the reduce-scatter, owner q's partial sums of r's bags);
    a rank's own share stays (grey)."""
    world = len(distributed)
    own_bags = [sum(b) for b in bags]
    fig, axes = plt.subplots(1, 2, figsize=(12, 1.6 + 1.5 * world))
    if scheme == "reduce_scatter":
        first = (
            "Distributed slots (reduce-scatter): (key, bag) pairs to the owner",
            lambda r, q: (
                f"{distributed[r][q]} keys + bag ids ({16 * distributed[r][q]} B)",
                f"partial sums of its {own_bags[r]} bags ({4 * dim * own_bags[r]} B)",
            ),
        )
    else:
        first = (
            "Distributed slots (all-to-all): each key to its owner",
            lambda r, q: (
                f"{distributed[r][q]} keys ({8 * distributed[r][q]} B)",
                f"{distributed[r][q]} vectors ({4 * dim * distributed[r][q]} B)",
            ),
        )
    panels = (
        first,
        (
            "Localized slots: each bag to its slot's owner",
            lambda r, q: (
                f"{bags[r][q]} bags, {keys[r][q]} keys ({8 * (bags[r][q] + keys[r][q])} B)",
                f"{bags[r][q]} pooled ({4 * dim * bags[r][q]} B)",
            ),
        ),
    )
    for ax, (title, label) in zip(axes, panels):
        for r in range(world):
            y = world - 1 - r
            ax.add_patch(Rectangle((0, y + 0.15), 1.2, 0.7, facecolor="#dde8f3", edgecolor="k"))
            ax.text(0.6, y + 0.5, f"rank {r}\nbatch", ha="center", va="center", fontsize=8)
            ax.add_patch(Rectangle((4.8, y + 0.15), 1.2, 0.7, facecolor="#f3e3d3", edgecolor="k"))
            ax.text(5.4, y + 0.5, f"rank {r}\ntable", ha="center", va="center", fontsize=8)
        for r in range(world):
            for q in range(world):
                y0, y1 = world - 1 - r + 0.5, world - 1 - q + 0.5
                own = r == q
                ax.annotate(
                    "",
                    (4.8, y1),
                    (1.2, y0),
                    arrowprops=dict(
                        arrowstyle="<|-|>", color="#999999" if own else "#333333", lw=1.0
                    ),
                )
                out, back = label(r, q)
                # crossing arrows: each label names its two ranks and sits on its sender's
                # side of the crossing (above it for an arrow going down, below for one up)
                x, y = 3.0, (y0 + y1) / 2 + (0 if own else 0.28 * (1 if y0 > y1 else -1))
                text = (
                    "stays on the rank"
                    if own
                    else f"rank {r} → rank {q}: {out}\nrank {q} → rank {r}: {back}"
                )
                box = dict(facecolor="white", edgecolor="none", alpha=0.8, pad=1)
                ax.text(
                    x,
                    y,
                    text,
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="#777777" if own else "black",
                    bbox=box,
                )
        ax.set_xlim(-0.1, 6.1)
        ax.set_ylim(-0.1, world + 0.1)
        ax.axis("off")
        ax.set_title(title, fontsize=10)
    fig.suptitle(
        f"One forward on N = {world}: what goes out (keys, int64) and comes back "
        f"(vectors, float32, D = {dim}); the backward sends the gradients of what came "
        "back",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def plot_ctr_losses(curves: Mapping[str, Sequence[float]], title: str = "") -> Figure:
    fig, ax = plt.subplots(figsize=(7, 3.2))
    styles = ["-", "--", ":", "-."]
    for i, (name, losses) in enumerate(curves.items()):
        ax.plot(range(1, len(losses) + 1), losses, styles[i % 4], label=name, lw=1.6)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (log loss)")
    ax.set_title(title or "CTR training")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
