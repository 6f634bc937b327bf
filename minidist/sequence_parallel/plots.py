"""Lesson 14's figure: one layer's saved activations per rank, by term, against t."""

from __future__ import annotations

from . import theory


def plot_activation_terms(batch: int, seq: int, hidden: int, heads: int, tps=(1, 2, 4)):
    """Stacked bars per t: tensor parallelism alone (left) and with sequence parallelism
    (right), each term of `theory.activation_terms` in KiB."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    names = [k for k in theory.activation_terms(batch, seq, hidden, heads, 1, False) if k]
    colors = dict(zip(names, plt.cm.tab10.colors))
    ticks, labels = [], []
    for i, t in enumerate(tps):
        for j, sp in enumerate((False, True)):
            x = 3 * i + j
            bottom = 0.0
            terms = theory.activation_terms(batch, seq, hidden, heads, t, sp)
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
    ax.set_title(f"activations of one layer (b={batch}, s={seq}, h={hidden}, a={heads}, float32)")
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig
