"""How many activation bytes a network keeps, with and without recomputation.

Chen et al. 2016, section 4.1: L layers, each keeping `activation` bytes for backward and
taking an input of `boundary` bytes. Without recomputation forward keeps L·activation.
Cut into segments of k layers, each recomputed: forward keeps only each segment's input,
⌈L/k⌉·boundary, and backward adds one segment's activations while it is recomputed,
k·activation, so the peak is ⌈L/k⌉·boundary + k·activation, smallest near k = √(L·b/a).
Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
section 4.1) give a transformer layer's `activation` in fp16: s·b·h·(34 + 5·a·s/h) bytes.
"""

from __future__ import annotations

import math


def saved_bytes(layers: int, activation: int, boundary: int, segment: int | None) -> dict:
    """Bytes kept: `forward` (after forward) and `peak` (during backward). `segment=None`:
    no recomputation."""
    if segment is None:
        return {"forward": layers * activation, "peak": layers * activation}
    if segment < 1:
        raise ValueError(f"segment must be >= 1, got {segment}")
    segments = math.ceil(layers / segment)
    kept = segments * boundary
    return {"forward": kept, "peak": kept + min(segment, layers) * activation}


def best_segment(layers: int, activation: int, boundary: int) -> int:
    """The segment length k in 1..L with the smallest peak."""
    return min(
        range(1, layers + 1), key=lambda k: saved_bytes(layers, activation, boundary, k)["peak"]
    )


def transformer_layer_activation_bytes(seq: int, batch: int, hidden: int, heads: int) -> float:
    """Korthikanti et al. 2022, eq. 1: fp16 activations of one layer, no parallelism."""
    return seq * batch * hidden * (34 + 5 * heads * seq / hidden)
