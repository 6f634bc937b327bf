"""Pictures for lesson 19's attention and routing (arXiv:2412.19437 §2.1).

- `plot_cache_per_token`: KV-cache elements per token of one model under MHA, GQA, MQA and
  MLA (DeepSeek-V2's Table 1 for DeepSeek-V3's sizes).
- `plot_expert_load`: tokens per expert over training steps, the bias update off and on.
- `plot_nodes_per_token`: how many nodes each token's experts span, node-limited or not.

Every function returns a matplotlib Figure and shows nothing itself.
"""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure


def plot_cache_per_token(elements: Mapping[str, float], bytes_per_element: int = 2) -> Figure:
    """One bar per attention (log axis): KiB of cache per token over all layers."""
    fig, ax = plt.subplots(figsize=(6, 3))
    names = list(elements)
    kib = [elements[n] * bytes_per_element / 1024 for n in names]
    bars = ax.barh(names, kib, color=["#c44e52" if n.startswith("MLA") else "#4c72b0"
                                      for n in names])  # fmt: skip
    ax.bar_label(bars, labels=[f"{k:,.0f} KiB" for k in kib], padding=3, fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(right=max(kib) * 8)
    ax.invert_yaxis()
    ax.set_xlabel(f"KV cache per token, all layers (KiB, {8 * bytes_per_element}-bit)")
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig


def plot_expert_load(loads: Mapping[str, torch.Tensor], layer: int = 0) -> Figure:
    """For each run ([steps, layers, experts] tokens per expert): the share of each expert
    of `layer` over the steps, stacked; the largest share per step drawn on the side."""
    runs = list(loads)
    fig, axes = plt.subplots(1, len(runs) + 1, figsize=(4 * (len(runs) + 1), 3.4))
    for ax, name in zip(axes, runs):
        share = loads[name][:, layer].double()
        share = share / share.sum(-1, keepdim=True)
        ax.stackplot(range(len(share)), share.T.numpy(), linewidth=0.3, edgecolor="white")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel(f"share of layer {layer}'s assignments")
        ax.set_ylim(0, 1)
    side = axes[-1]
    for name in runs:
        share = loads[name][:, layer].double()
        side.plot((share.max(-1).values / share.mean(-1)).numpy(), label=name)
    side.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
    side.set_xlabel("step")
    side.set_ylabel("busiest expert / mean load")
    side.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_nodes_per_token(counts: Mapping[str, torch.Tensor], nodes: int) -> Figure:
    """For each routing: the share of tokens whose experts span 1, 2, ... `nodes` nodes."""
    fig, ax = plt.subplots(figsize=(6, 3))
    width = 0.8 / len(counts)
    for i, (name, spans) in enumerate(counts.items()):
        share = torch.bincount(spans.flatten(), minlength=nodes + 1)[1:].double() / spans.numel()
        ax.bar([n + 1 + (i - (len(counts) - 1) / 2) * width for n in range(nodes)],
               share.numpy(), width=width, label=name)  # fmt: skip
    ax.set_xticks(range(1, nodes + 1))
    ax.set_xlabel("nodes a token's experts span")
    ax.set_ylabel("share of tokens")
    ax.legend(fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig
