"""Pictures for tensor parallelism (notebook 07) and, re-exported from `layout_plots.py`,
the parallel layout (notebook 08).

- `plot_weight_split`: which rank holds which part of each split weight: a column-parallel
  Linear (rows of W), a row-parallel Linear (columns of W), the fused Q, K, V weight (each
  section split by heads) and the vocabulary (rows of the embedding, padded to a multiple
  of t, the padding hatched). Shoeybi et al. 2019, "Megatron-LM", section 3, Figure 3.
- `plot_f_g`: a transformer block as two tensor-parallel regions, where f and g sit and what
  each all-reduces in forward and in backward (Megatron-LM, Figure 3).
- `plot_memory_vs_tp`: model states per rank against t, formula bars and measured points.
- `plot_rank_grid`, `plot_comm_seconds` (`layout_plots.py`): the ranks of a t·p·d world by
  group kind (Narayanan et al. 2021, section 3), and α-β seconds of communication per step.

Every function returns a matplotlib Figure and shows nothing itself.
"""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Patch, Rectangle

from .layout_plots import plot_comm_seconds, plot_rank_grid

__all__ = [
    "plot_weight_split",
    "plot_f_g",
    "plot_rank_grid",
    "plot_memory_vs_tp",
    "plot_comm_seconds",
]

_CMAP = plt.get_cmap("tab10")


def _rank_color(r: int):
    return _CMAP(r % 10)


def _blocks(ax, x0, y0, width, height, parts, vertical: bool, pad_from: float | None = None):
    """Cut a width × height rectangle into `parts` (a list of (rank, fraction)), stacked
    down (vertical) or across; the part from fraction `pad_from` on is hatched padding."""
    pos = 0.0
    for rank, frac in parts:
        if vertical:
            box = (x0, y0 + height * (1 - pos - frac), width, height * frac)
        else:
            box = (x0 + width * pos, y0, width * frac, height)
        ax.add_patch(
            Rectangle(
                box[:2],
                box[2],
                box[3],
                facecolor=_rank_color(rank),
                edgecolor="white",
                linewidth=1.5,
                alpha=0.85,
            )
        )
        pos += frac
    if pad_from is not None and pad_from < 1:
        frac = 1 - pad_from
        ax.add_patch(
            Rectangle(
                (x0, y0),
                width,
                height * frac,
                facecolor="white",
                edgecolor="gray",
                hatch="///",
                linewidth=0.8,
            )
        )
    ax.add_patch(Rectangle((x0, y0), width, height, fill=False, edgecolor="black", linewidth=1))


def plot_weight_split(tp: int, hidden: int = 32, heads: int = 4, vocab: int = 30) -> Figure:
    """Four weights of the course GPT on `tp` ranks, coloured by the rank that holds each part.

    Shapes are drawn to scale within each panel (PyTorch's (out, in) convention for Linear).
    """
    if heads % tp or hidden % tp:
        raise ValueError(f"plot_weight_split: heads={heads} and hidden={hidden} need tp | both")
    fig, axes = plt.subplots(1, 4, figsize=(13, 4.2))
    per = 1 / tp

    # column-parallel: W (4h × h) of the MLP's first Linear, split by output rows
    ax = axes[0]
    _blocks(ax, 0, 0, 1, 4, [(r, per) for r in range(tp)], vertical=True)
    ax.set_title(f"column-parallel: W ({4 * hidden} × {hidden})\nsplit by output rows", fontsize=9)
    ax.text(
        0.5,
        -0.35,
        "Y_r = X W_rᵀ: no communication;\neach rank has its own hidden units",
        ha="center",
        va="top",
        fontsize=8,
    )

    # row-parallel: W (h × 4h) of the MLP's second Linear, split by input columns
    ax = axes[1]
    _blocks(ax, 0, 1.5, 4, 1, [(r, per) for r in range(tp)], vertical=False)
    ax.set_title(f"row-parallel: W ({hidden} × {4 * hidden})\nsplit by input columns", fontsize=9)
    ax.text(
        2,
        1.15,
        "Y = Σ_r X_r W_rᵀ: partial sums,\nadded by one all-reduce (g)",
        ha="center",
        va="top",
        fontsize=8,
    )

    # fused Q, K, V: three sections of h rows, each split by heads
    ax = axes[2]
    local_heads = heads // tp
    for s, name in enumerate("QKV"):
        y0 = 3 - s
        _blocks(ax, 0, y0, 1, 1, [(r, per) for r in range(tp)], vertical=True)
        ax.text(-0.08, y0 + 0.5, name, ha="right", va="center", fontsize=10, weight="bold")
        for r in range(tp):
            first = r * local_heads
            label = ", ".join(str(h) for h in range(first, first + local_heads))
            ax.text(
                0.5,
                y0 + 1 - (r + 0.5) * per,
                f"heads {label}",
                ha="center",
                va="center",
                fontsize=7,
            )
    ax.set_title(
        f"attention: qkv.weight ({3 * hidden} × {hidden})\neach of Q, K, V split by heads",
        fontsize=9,
    )
    ax.text(
        0.5,
        -0.15,
        f"{local_heads} of {heads} heads per rank;\nproj.weight row-parallel",
        ha="center",
        va="top",
        fontsize=8,
    )

    # vocabulary: rows of the embedding, padded to a multiple of tp
    ax = axes[3]
    padded = -(-vocab // tp) * tp
    rows = padded // tp
    height = 4
    _blocks(
        ax, 0, 0, 1, height, [(r, per) for r in range(tp)], vertical=True, pad_from=vocab / padded
    )
    for r in range(tp):
        ax.text(
            1.08,
            height * (1 - (r + 0.5) * per),
            f"rows [{r * rows}, {(r + 1) * rows})",
            ha="left",
            va="center",
            fontsize=7,
        )
    if padded > vocab:
        rows_text = f"{vocab} → {padded}"
        note = f"V = {vocab} padded to {padded}:\n{padded - vocab} padding rows (hatched)"
    else:
        rows_text, note = f"{vocab}", f"V = {vocab} divides by t = {tp}:\nno padding"
    ax.set_title(
        f"tok_emb.weight = head ({rows_text} × {hidden})\nsplit by vocabulary rows", fontsize=9
    )
    ax.text(0.5, -0.35, note, ha="center", va="top", fontsize=8)

    for ax in axes:
        ax.set_aspect("equal")
        ax.autoscale_view()
        ax.axis("off")
    axes[0].set_xlim(-0.6, 1.6)
    axes[1].set_xlim(-0.3, 4.3)
    axes[1].set_ylim(0, 4)
    axes[2].set_xlim(-0.6, 1.6)
    axes[2].set_ylim(-0.9, 4.1)
    axes[3].set_xlim(-0.4, 2.6)
    for ax in (axes[0], axes[3]):
        ax.set_ylim(-1.1, 4.1)
    handles = [Patch(color=_rank_color(r), label=f"tp rank {r}") for r in range(tp)]
    fig.legend(handles=handles, loc="lower center", ncol=tp, fontsize=8, frameon=False)
    fig.suptitle(f"who holds what at tp = {tp}", fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    return fig


def _box(ax, x, y, w, h, text, color, fontsize=8, weight="normal"):
    ax.add_patch(
        FancyBboxPatch(
            (x, y),
            w,
            h,
            boxstyle="round,pad=0.02",
            facecolor=color,
            edgecolor="black",
            linewidth=0.8,
        )
    )
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, weight=weight)


def _arrow(ax, x0, y0, x1, y1):
    ax.annotate("", (x1, y1), (x0, y0), arrowprops=dict(arrowstyle="->", linewidth=1))


def plot_f_g(tp: int = 2) -> Figure:
    """A transformer block as Megatron-LM splits it: two regions, each between f and g."""
    fig, ax = plt.subplots(figsize=(13, 4.6))
    f_color, g_color, rep_color = "#8fd18f", "#f4a582", "#e8e8e8"
    y_mid = 2.0
    lane_h = 0.5
    lanes = [y_mid + (tp - 1) * 0.35 - i * 0.7 for i in range(tp)]

    def region(x0, name, stages, widths):
        _box(ax, x0, y_mid - 0.3, 0.55, 0.6, "f", f_color, 12, "bold")
        x = x0 + 0.8
        for lane, r in zip(lanes, range(tp)):
            xi = x
            for j, (stage, w) in enumerate(zip(stages, widths)):
                _box(ax, xi, lane - lane_h / 2, w, lane_h, stage.format(r=r), _rank_color(r), 7)
                if j + 1 < len(stages):  # QKV -> attention -> proj, A -> GELU -> B
                    _arrow(ax, xi + w, lane, xi + w + 0.15, lane)
                xi += w + 0.15
            _arrow(ax, x0 + 0.55, y_mid, x, lane)
            _arrow(ax, xi - 0.15, lane, xi + 0.2, y_mid)
        x_end = x + sum(widths) + 0.15 * len(widths) + 0.2
        _box(ax, x_end, y_mid - 0.3, 0.55, 0.6, "g", g_color, 12, "bold")
        ax.text(
            (x0 + x_end + 0.55) / 2,
            max(lanes) + 0.55,
            name,
            ha="center",
            fontsize=9,
            style="italic",
        )
        return x_end + 0.55

    top = max(lanes) + 0.85  # the residual stream runs above the regions

    def residual(x_from, x_plus):  # from x_from's top, over the region, down into "+"
        ax.plot([x_from, x_from, x_plus], [y_mid + 0.3, top, top], color="black", linewidth=1)
        _arrow(ax, x_plus, top, x_plus, y_mid + 0.3)

    x = 0.0
    _box(ax, x, y_mid - 0.3, 0.6, 0.6, "x", rep_color, 9)
    _box(ax, x + 0.85, y_mid - 0.3, 0.7, 0.6, "LN1", rep_color, 8)
    _arrow(ax, x + 0.6, y_mid, x + 0.85, y_mid)
    _arrow(ax, x + 1.55, y_mid, x + 1.8, y_mid)
    x = region(
        1.8,
        "attention: heads split",
        ["Q K V\nheads of r{r}", "attention\n(own heads)", "proj_r\n(rows)"],
        [0.95, 0.95, 0.8],
    )
    _box(ax, x + 0.25, y_mid - 0.3, 0.45, 0.6, "+", rep_color, 11)
    _arrow(ax, x, y_mid, x + 0.25, y_mid)
    residual(0.3, x + 0.475)  # x + attention(LN1(x))
    first_plus = x + 0.475
    x += 0.7
    _box(ax, x + 0.25, y_mid - 0.3, 0.7, 0.6, "LN2", rep_color, 8)
    _arrow(ax, x, y_mid, x + 0.25, y_mid)
    _arrow(ax, x + 0.95, y_mid, x + 1.2, y_mid)
    x = region(
        x + 1.2,
        "MLP: hidden units split",
        ["A_r\n(columns)", "GELU", "B_r\n(rows)"],
        [0.8, 0.6, 0.8],
    )
    _box(ax, x + 0.25, y_mid - 0.3, 0.45, 0.6, "+", rep_color, 11)
    _arrow(ax, x, y_mid, x + 0.25, y_mid)
    residual(first_plus + 0.12, x + 0.475)  # h + MLP(LN2(h)), h the first "+"'s output
    ax.text(0.35, top + 0.08, "residual", fontsize=7, style="italic")
    right = x + 0.7
    bottom = min(lanes) - 0.6
    ax.text(
        0.0,
        bottom - 0.15,
        "f: forward identity (every rank gets the same x); backward ALL-REDUCE of ∂L/∂x "
        "(each rank's heads / hidden units give a partial gradient), b·s·h elements\n"
        "g: forward ALL-REDUCE of the partial outputs (Σ over ranks of Y_r B_r), b·s·h "
        "elements; backward identity (the gradient is already the same on every rank)\n"
        "grey: replicated (every tp rank computes the same layer norms, residuals and "
        "biases after g); coloured: split, rank r's part. Per layer: 2 all-reduces forward, "
        "2 backward.",
        ha="left",
        va="top",
        fontsize=8,
    )
    ax.set_xlim(-0.2, right + 0.2)
    ax.set_ylim(bottom - 1.2, top + 0.35)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(
        f"one transformer layer on {tp} tensor-parallel ranks (Megatron-LM, Figure 3)", fontsize=10
    )
    fig.tight_layout()
    return fig


def plot_memory_vs_tp(
    formula: Mapping[int, float],
    measured: Mapping[int, float] | None = None,
    unit: tuple[str, float] = ("KiB", 1024),
    title: str = "",
) -> Figure:
    """Model states per rank against t: formula bars ({t: bytes}), measured points."""
    measured = measured or {}
    name, scale = unit
    fig, ax = plt.subplots(figsize=(6, 3.6))
    tps = sorted(formula)
    xs = range(len(tps))
    ax.bar(
        xs,
        [formula[t] / scale for t in tps],
        0.6,
        color="#4c72b0",
        alpha=0.5,
        hatch="//",
        edgecolor="black",
        linewidth=0.5,
        label="formula",
    )
    for x, t in zip(xs, tps):
        ax.text(
            x, formula[t] / scale, f"{formula[t] / scale:.0f}", ha="center", va="bottom", fontsize=8
        )
        if t in measured:
            ax.plot(
                x,
                measured[t] / scale,
                "o",
                color="#c44e52",
                markeredgecolor="black",
                label="measured (rank 0)" if x == 0 else None,
            )
    ax.set_xticks(list(xs), [f"t = {t}" for t in tps])
    ax.set_ylabel(f"parameters + grads + momentum per rank ({name})")
    ax.legend(fontsize=8)
    ax.margins(y=0.15)
    ax.set_title(title or "model states per rank against the tensor-parallel size", fontsize=10)
    fig.tight_layout()
    return fig
