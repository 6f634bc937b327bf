"""Lesson 19's attention picture: the KV cache per token of one model under MHA, GQA, MQA
and MLA (DeepSeek-V2's Table 1 for DeepSeek-V3's sizes, arXiv:2412.19437 §2.1.1). Returns a
matplotlib Figure and shows nothing itself."""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
from matplotlib.figure import Figure


def plot_cache_per_token(elements: Mapping[str, float], bytes_per_element: int = 2) -> Figure:
    """One bar per attention (log axis): KiB of cache per token over all layers."""
    fig, ax = plt.subplots(figsize=(6, 3))
    names = list(elements)
    kib = [elements[n] * bytes_per_element / 1024 for n in names]
    bars = ax.barh(
        names, kib, color=["#c44e52" if n.startswith("MLA") else "#4c72b0" for n in names]
    )
    ax.bar_label(bars, labels=[f"{k:,.0f} KiB" for k in kib], padding=3, fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(right=max(kib) * 8)
    ax.invert_yaxis()
    ax.set_xlabel(f"KV cache per token, all layers (KiB, {8 * bytes_per_element}-bit)")
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig
