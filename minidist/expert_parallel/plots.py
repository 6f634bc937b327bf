"""Lesson 16's figures: capacity and dropped tokens for one routing, and the load per expert
trained with and without the auxiliary loss."""

from __future__ import annotations

import torch

from .routing import tokens_per_expert


def plot_capacity(routings: dict[float, object], num_experts: int):
    """One group's assignments per expert, kept (solid) and dropped (hatched), with the
    capacity C drawn, for each capacity factor in `routings` ({factor: Routing})."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(routings), figsize=(4 * len(routings), 3), sharey=True)
    for ax, (cf, r) in zip(axes, routings.items()):
        kept, dropped = tokens_per_expert(r, num_experts)
        xs = range(num_experts)
        ax.bar(xs, kept.tolist(), color="tab:blue", label="kept")
        ax.bar(
            xs,
            dropped.tolist(),
            bottom=kept.tolist(),
            color="white",
            edgecolor="tab:red",
            hatch="//",
            label="dropped",
        )
        ax.axhline(r.capacity, color="black", linestyle="--", linewidth=1)
        ax.text(num_experts - 0.5, r.capacity, f" C = {r.capacity}", va="bottom", ha="right")
        ax.set_xticks(list(xs))
        ax.set_xlabel("expert")
        ax.set_title(f"capacity factor {cf}: {int(dropped.sum())} dropped", fontsize=9)
    axes[0].set_ylabel("tokens routed (one group)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_balance(runs: dict[float, object]):
    """Left: tokens per expert (first choices) at the last step for each weight λ of the aux
    loss; middle: the aux loss over the steps; right: the dropped share of the assignments
    ({λ: BalanceRun})."""
    import matplotlib.pyplot as plt

    fig, (left, mid, right) = plt.subplots(1, 3, figsize=(13, 3.4))
    width = 0.8 / len(runs)
    for i, (weight, run) in enumerate(runs.items()):
        counts = torch.tensor(run.first_choices[-1], device="cpu")
        xs = [x + (i - (len(runs) - 1) / 2) * width for x in range(len(counts))]
        left.bar(xs, counts.tolist(), width, label=f"λ = {weight}")
        mid.plot(run.aux, label=f"λ = {weight}")
        frac = [d / sum(run.first_choices[0]) for d in run.dropped]
        right.plot(frac, color=mid.lines[-1].get_color(), label=f"λ = {weight}")
    left.set_xlabel("expert")
    left.set_ylabel("tokens (first choice), last step")
    left.set_title("load per expert after training", fontsize=9)
    left.legend(fontsize=8)
    mid.axhline(1.0, color="gray", linewidth=0.8, linestyle=":")
    mid.set_xlabel("step")
    mid.set_ylabel("aux loss E·Σ f·P")
    mid.set_title("aux loss (1 = balanced, E = all on one expert)", fontsize=9)
    mid.legend(fontsize=8)
    right.set_xlabel("step")
    right.set_ylabel("share of the assignments dropped")
    right.set_ylim(0, 1)
    right.set_title("dropped (capacity factor 1)", fontsize=9)
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_padding(
    factors: list[float],
    exact: list[float],
    padded: list[float],
    balanced: float,
    dropped: list[int],
):
    """All-to-all bytes per rank and step against the capacity factor: exact dispatch (the
    measured routing: only kept tokens move), padded to capacity (E/e·C rows to every rank,
    whatever the routing) and the balanced estimate (every assignment kept, spread evenly);
    the dropped assignments on a second axis."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.0))
    ax.plot(factors, exact, "o-", label="exact: the kept rows only (measured)")
    ax.plot(factors, padded, "s--", label="padded to capacity (GShard; = theory)")
    ax.axhline(
        balanced,
        color="gray",
        linestyle=":",
        label="balanced estimate: nothing dropped, 1/e of it stays home",
    )
    ax.set_xlabel("capacity factor")
    ax.set_ylabel("all-to-all bytes per rank and step")
    ax.set_xticks(factors)
    twin = ax.twinx()
    twin.bar(factors, dropped, width=0.12, color="tab:red", alpha=0.25)
    twin.set_ylabel("assignments dropped (bars)", color="tab:red")
    # below the axes: inside, the legend would cover a bar
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2)
    ax.set_zorder(twin.get_zorder() + 1)
    ax.patch.set_visible(False)
    fig.tight_layout()
    return fig
