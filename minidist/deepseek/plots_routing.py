"""Lesson 19's routing pictures: each expert's share of the tokens over the steps, with the
bias update off and on (`moe.load_over_steps`'s data); how many nodes each token's experts
span, node-limited or not (`moe.nodes_per_token`'s)."""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure


def plot_expert_load(runs: dict[str, torch.Tensor], layer: int = 0) -> Figure:
    """One panel per run of `runs` ({label: [steps, layers, experts] loads}): MoE layer
    `layer`'s tokens per expert over the steps, over the mean (1 = balanced), one line per
    expert, and the most loaded expert's in black."""
    fig, axes = plt.subplots(
        1, len(runs), figsize=(4.5 * len(runs), 3.2), sharey=True, squeeze=False
    )
    for ax, (label, loads) in zip(axes[0], runs.items()):
        if loads.dim() != 3 or not 0 <= layer < loads.shape[1]:
            raise ValueError(
                f"plot_expert_load: {label}'s loads {tuple(loads.shape)} must be "
                f"[steps, layers, experts] with layer {layer} in range"
            )
        share = loads[:, layer].double()
        share = share / share.mean(-1, keepdim=True)
        for e in range(share.shape[-1]):
            ax.plot(share[:, e], lw=0.8, alpha=0.6)
        ax.plot(share.max(-1).values, color="black", lw=1.6, label="max / mean")
        ax.axhline(1.0, color="grey", ls=":", lw=0.8)
        ax.set_title(label)
        ax.set_xlabel("step")
    axes[0][0].set_ylabel("tokens / mean tokens")
    axes[0][0].legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


def plot_nodes_per_token(counts: Mapping[str, torch.Tensor], nodes: int) -> Figure:
    """For each routing: the share of tokens whose experts span 1, 2, ... `nodes` nodes."""
    fig, ax = plt.subplots(figsize=(6, 3))
    width = 0.8 / len(counts)
    for i, (name, spans) in enumerate(counts.items()):
        share = torch.bincount(spans.flatten(), minlength=nodes + 1)[1:].double() / spans.numel()
        ax.bar(
            [n + 1 + (i - (len(counts) - 1) / 2) * width for n in range(nodes)],
            share.numpy(),
            width=width,
            label=name,
        )
    ax.set_xticks(range(1, nodes + 1))
    ax.set_xlabel("nodes a token's experts span")
    ax.set_ylabel("share of tokens")
    ax.legend(fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig
