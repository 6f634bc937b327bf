"""Pictures for mixed precision (notebook 04): where numbers fall, how the scale moves.

- `plot_number_lines`: fp16 and bf16 on a log2 axis, their ranges drawn (flushed to zero,
  subnormal, normal, overflow; `theory.float_format`), with measured gradient magnitudes as
  histograms, before and after multiplying by a loss scale (Micikevicius et al. 2018,
  section 3.2 and Figure 3).
- `plot_loss_scale`: the dynamic loss scale over steps, skipped steps marked, next to
  `torch.amp.GradScaler`'s sequence for the same overflows.
- `plot_loss_curves`: low-precision training's loss next to fp32's, and the difference.

Every function returns a matplotlib Figure and shows nothing itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from . import theory

_ZONES = {  # fate -> colour
    "zero": "#c44e52",
    "subnormal": "#dd8452",
    "normal": "#55a868",
    "overflow": "#8c1c13",
}


def _log2(values: torch.Tensor) -> torch.Tensor:
    v = values.detach().double().abs().flatten()
    return torch.log2(v[v > 0])


def plot_number_lines(
    magnitudes: Mapping[str, torch.Tensor],
    scale: float,
    dtypes: Sequence[torch.dtype] = (torch.float16, torch.bfloat16),
    scaled: Sequence[torch.dtype] = (torch.float16,),
    xlim: tuple[float, float] = (-48, 20),
    title: str = "",
) -> Figure:
    """One row per format: its zones on a log2 axis (values up to half the smallest
    subnormal round to zero, subnormals keep fewer bits, normals up to the max, beyond it
    inf), and histograms of the log2 of `magnitudes` ({label: values}) as measured (outline)
    and, for the formats in `scaled`, multiplied by `scale` (filled). The percentages in
    each row's title are `theory.fate`'s."""
    fig, axes = plt.subplots(len(dtypes), 1, figsize=(9, 2.7 * len(dtypes)), sharex=True)
    axes = list(axes) if len(dtypes) > 1 else [axes]
    lo, hi = xlim
    bins = torch.arange(lo, hi + 0.5, 0.5, device="cpu").tolist()
    colors = plt.get_cmap("tab10")
    shift = math.log2(scale)
    for ax, dtype in zip(axes, dtypes):
        f = theory.float_format(dtype)
        sub, normal = math.log2(f.smallest_subnormal), math.log2(f.smallest_normal)
        top = math.log2(f.max)
        zones = [
            ("zero", "rounds to 0", lo - 200, sub - 1),
            ("subnormal", "subnormal", sub - 1, normal),
            ("normal", "normal", normal, top),
            ("overflow", "inf", top, hi + 200),
        ]
        for zone, name, a, b in zones:
            ax.axvspan(a, b, color=_ZONES[zone], alpha=0.15, linewidth=0)
            if a < hi and b > lo:
                x = (max(a, lo) + min(b, hi)) / 2
                box = dict(facecolor="white", edgecolor="none", alpha=0.8, pad=1)
                ax.text(
                    x,
                    0.03,
                    name,
                    transform=ax.get_xaxis_transform(),
                    ha="center",
                    fontsize=7,
                    color=_ZONES[zone],
                    bbox=box,
                )
        # zero ends at half the smallest subnormal: (2^-25, 2^-24) in fp16 rounds up to 2^-24
        lines = [
            (sub - 1, f"2^{sub - 1:.0f} ", "right"),
            (sub, f" 2^{sub:.0f}", "left"),
            (normal, f" 2^{normal:.0f}", "left"),
            (top, f" {f.max:g}", "left"),
        ]
        for x, label, align in lines:
            if lo <= x <= hi:
                ax.axvline(x, color="black", linewidth=0.8, linestyle=":")
                ax.text(
                    x,
                    0.97,
                    label,
                    transform=ax.get_xaxis_transform(),
                    fontsize=7,
                    va="top",
                    ha=align,
                )
        notes = []
        for i, (label, values) in enumerate(magnitudes.items()):
            logs = _log2(values)
            ax.hist(
                logs.clamp(lo, hi).tolist(),
                bins=bins,
                histtype="step",
                color=colors(i),
                linewidth=1.2,
                label=f"{label}, as computed",
            )
            note = f"{label} {100 * theory.fate(values, dtype)['zero']:.2f}%"
            if dtype in scaled:
                ax.hist(
                    (logs + shift).clamp(lo, hi).tolist(),
                    bins=bins,
                    color=colors(i),
                    alpha=0.45,
                    label=f"{label} × 2^{shift:g}",
                )
                after = theory.fate(values, dtype, scale)
                note += f" (× 2^{shift:g}: {100 * after['zero']:.2f}%)"
            notes.append(note)
        ax.set_title(f"{f.name}: rounds to zero: " + ", ".join(notes), fontsize=8, loc="left")
        ax.set_ylabel("elements", fontsize=9)
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(bottom=0.5)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    axes[-1].set_xlabel("log2 |value|")
    fig.suptitle(title or "where gradients fall on the number line", fontsize=10)
    fig.tight_layout()
    return fig


def plot_loss_scale(
    scales: Sequence[float],
    stepped: Sequence[bool],
    torch_scales: Sequence[float] | None = None,
    init_scale: float = 2.0**16,
    title: str = "",
) -> Figure:
    """The scale in force at each step (log2), from `init_scale` and the scales after each
    step; skipped steps (an overflow somewhere) marked; `torch_scales`, GradScaler's scales
    after each step for the same overflows, drawn over it."""
    used = [init_scale, *scales[:-1]]
    steps = list(range(len(scales)))
    fig, ax = plt.subplots(figsize=(8, 3.2))
    ax.step(
        steps,
        [math.log2(s) for s in used],
        where="post",
        color="#4c72b0",
        linewidth=2,
        label="minidist DynamicLossScaler (every rank)",
    )
    if torch_scales is not None:
        torch_used = [init_scale, *torch_scales[:-1]]
        ax.plot(
            steps,
            [math.log2(s) for s in torch_used],
            "x",
            color="black",
            markersize=8,
            label="torch.amp.GradScaler",
        )
    skipped = [s for s, ok in zip(steps, stepped) if not ok]
    for s in skipped:
        ax.axvspan(s - 0.4, s + 0.4, color="#c44e52", alpha=0.2, linewidth=0)
    ax.plot(
        skipped,
        [math.log2(used[s]) for s in skipped],
        "o",
        color="#c44e52",
        label="overflow: step skipped, scale halved",
    )
    ax.set_xticks(steps)
    ax.set_xlabel("step")
    ax.set_ylabel("log2(loss scale) in force")
    ax.legend(fontsize=8)
    ax.set_title(title or "dynamic loss scale")
    fig.tight_layout()
    return fig


def plot_loss_curves(
    curves: Mapping[str, Sequence[float]],
    reference: Sequence[float],
    title: str = "",
    tolerances: Mapping[str, float] | None = None,
    log_diff: bool = False,
) -> Figure:
    """Left: the fp32 reference's loss and each curve. Right: each curve minus fp32, with a
    dotted ±tolerance where `tolerances` gives one; with `log_diff`, |curve - fp32| on a log
    axis instead (differences from 1e-7 to 1e-1 side by side), exact zeros drawn as
    triangles on a dotted floor a tenth of the smallest nonzero difference."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
    steps = list(range(len(reference)))
    left.plot(steps, reference, color="black", linewidth=2.5, label="fp32, one process")
    colors = plt.get_cmap("tab10")
    nonzero = [abs(a - b) for c in curves.values() for a, b in zip(c, reference) if a != b]
    floor = min(nonzero, default=1.0) / 10  # where an exact zero is drawn on a log axis
    zeros_drawn = False
    for i, (label, losses) in enumerate(curves.items()):
        left.plot(steps, losses, "--", color=colors(i), label=label)
        points = [(s, a - b) for s, a, b in zip(steps, losses, reference)]
        if log_diff:  # |difference|; an exact zero has no place on a log axis: drawn at floor
            zeros = [s for s, d in points if d == 0]
            points = [(s, abs(d) if d != 0 else floor) for s, d in points]
            if zeros:
                right.plot(zeros, [floor] * len(zeros), "v", color=colors(i), markersize=6)
                zeros_drawn = True
        right.plot(
            [s for s, _ in points],
            [d for _, d in points],
            "o-",
            color=colors(i),
            label=label,
            markersize=3,
        )
        tol = (tolerances or {}).get(label)
        for sign in (1,) if log_diff else (-1, 1):
            if tol is not None:
                right.axhline(sign * tol, color=colors(i), linestyle=":", linewidth=1)
    if log_diff:
        right.set_yscale("log")
        if zeros_drawn:
            right.axhline(floor, color="gray", linestyle=":", linewidth=0.8)
            right.plot([], [], "v", color="gray", label=f"exactly 0 (drawn at {floor:.0e})")
    else:
        right.axhline(0, color="black", linewidth=1)
    for ax in (left, right):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.set_xlabel("step")
    left.set_ylabel("loss")
    left.legend(fontsize=8)
    right.set_xlabel("step")
    right.set_ylabel("|loss - fp32 loss|" if log_diff else "loss - fp32 loss")
    right.legend(fontsize=8)
    fig.suptitle(title or "low precision tracks fp32", fontsize=10)
    fig.tight_layout()
    return fig
