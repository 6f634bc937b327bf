"""Lesson 14's figure: one layer's saved activations per rank, by term, against t."""

from __future__ import annotations

from . import theory


def plot_activation_terms(seq: int, batch: int, hidden: int, heads: int, tps=(1, 2, 4)):
    """Stacked bars per t: tensor parallelism alone (left) and with sequence parallelism
    (right), each term of `theory.activation_terms` in KiB."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    names = [k for k in theory.activation_terms(seq, batch, hidden, heads, 1, False) if k]
    colors = dict(zip(names, plt.cm.tab10.colors))
    ticks, labels = [], []
    for i, t in enumerate(tps):
        for j, sp in enumerate((False, True)):
            x = 3 * i + j
            bottom = 0.0
            terms = theory.activation_terms(seq, batch, hidden, heads, t, sp)
            for name in names:
                kib = terms[name] / 1024
                if kib:
                    label = name if (i, j) == (0, 0) else None
                    ax.bar(x, kib, bottom=bottom, color=colors[name], label=label)
                bottom += kib
            ticks.append(x)
            labels.append(f"t={t}\n{'TP+SP' if sp else 'TP'}")
    ax.set_xticks(ticks, labels)
    ax.set_ylabel("KiB saved per rank, one layer")
    ax.set_title(f"activations of one layer (s={seq}, b={batch}, h={hidden}, a={heads}, float32)")
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


def plot_block_regions(tp: int = 2):
    """One layer as lesson 07 splits it (top) and with sequence parallelism (bottom): which
    activations are whole, split along the sequence or split by heads/columns, the residual
    connections, the collective at each border (lesson 07's f and g; the paper's g and ḡ,
    Korthikanti et al. 2022, Figure 5) and the all-gather that backward adds to rebuild a
    region's stored input block."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch

    colors = {"whole": "#d9d9d9", "sequence": "#9ecae1", "split": "#fdae6b"}
    steps = ["LN1", "attention\n(heads)", "+", "LN2", "MLP\n(columns)", "+"]
    labels = {  # (enter a region, leave it), per row
        False: ("f: identity\n(bwd: all-reduce)", "g: all-reduce\n(bwd: identity)"),
        True: ("g: all-gather\n(bwd: reduce-scatter)", "ḡ: reduce-scatter\n(bwd: all-gather)"),
    }
    fig, ax = plt.subplots(figsize=(11, 4.8))
    for row, (sp, title) in enumerate(((False, "tensor parallel"), (True, "+ sequence parallel"))):
        y = 2.0 - 2.3 * row
        ax.text(-0.2, y + 0.25, title, ha="right", va="center", fontsize=9, weight="bold")
        x, starts = 0.0, []
        for step in steps:
            inside = "(" in step
            kind = "split" if inside else ("sequence" if sp else "whole")
            width = 1.3 if inside else 0.7
            starts.append((x, width))
            ax.add_patch(
                FancyBboxPatch(
                    (x, y),
                    width,
                    0.5,
                    boxstyle="round,pad=0.02",
                    facecolor=colors[kind],
                    edgecolor="black",
                )
            )
            shape = "b·s·h" if kind == "whole" else ("b·(s/t)·h" if kind == "sequence" else "")
            ax.text(x + width / 2, y + 0.25, step, ha="center", va="center", fontsize=8)
            if shape:
                ax.text(x + width / 2, y - 0.12, shape, ha="center", va="top", fontsize=7)
            if inside and sp:
                note = "keeps its input's block;\nbwd: all-gathers it again"
                ax.text(
                    x + width / 2,
                    y - 0.12,
                    note,
                    ha="center",
                    va="top",
                    fontsize=6.5,
                    color="purple",
                )
            nxt = x + width + 0.55
            if inside or step.startswith("LN"):
                label = labels[sp][0 if step.startswith("LN") else 1]
                ax.annotate(
                    "",
                    (nxt - 0.05, y + 0.25),
                    (x + width + 0.05, y + 0.25),
                    arrowprops=dict(arrowstyle="->", color="crimson"),
                )
                ax.text(
                    x + width + 0.27, y + 0.62, label, ha="center", fontsize=6.5, color="crimson"
                )
            else:
                ax.annotate(
                    "",
                    (nxt - 0.05, y + 0.25),
                    (x + width + 0.05, y + 0.25),
                    arrowprops=dict(arrowstyle="->"),
                )
            x = nxt
        for first, plus in ((0, 2), (3, 5)):  # residual: the LN's input joins at the "+"
            (x0, _), (x1, w1) = starts[first], starts[plus]
            style = "arc,angleA=90,angleB=90,armA=42,armB=42,rad=6"  # above the labels
            ax.add_patch(
                FancyArrowPatch(
                    (x0 + 0.1, y + 0.52),
                    (x1 + w1 / 2, y + 0.52),
                    connectionstyle=style,
                    arrowstyle="->",
                    color="dimgray",
                    linewidth=0.9,
                )
            )
        ax.text(starts[0][0], y + 1.1, "residual", fontsize=6.5, color="dimgray", ha="right")
    kinds = (
        ("whole on every tp rank", "whole"),
        ("split along the sequence", "sequence"),
        ("split by heads / columns", "split"),
    )
    handles = [Patch(facecolor=colors[k], edgecolor="black", label=label) for label, k in kinds]
    ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8)
    ax.set_xlim(-2.2, x)
    ax.set_ylim(-0.9, 3.4)
    ax.axis("off")
    ax.set_title(
        f"one layer on t = {tp} ranks: where each activation lives, and the "
        "collective at each border",
        fontsize=10,
    )
    fig.tight_layout()
    return fig
