"""How many activation bytes a network keeps, with and without recomputation.

Chen et al. 2016 ("Training Deep Nets with Sublinear Memory Cost", arXiv:1604.06174),
section 4.1: L layers, each keeping `activation` bytes for backward and taking an input of
`boundary` bytes. Without recomputation forward keeps L·activation. Cut into segments of k
layers, each recomputed: forward keeps only each segment's input, ⌈L/k⌉·boundary, and
backward adds one segment's activations while it is recomputed, k·activation, so the peak
is ⌈L/k⌉·boundary + k·activation, smallest near k = √(L·M_in/M_act), with M_in the
boundary and M_act the activation bytes (√L when M_act = M_in).

`chain_peak_bytes` is what a chain of layers that save their own input (a pre-LayerNorm
transformer block does: its first LayerNorm saves it) holds at most, exactly: the
recomputed segment's first layer saves the very input the checkpoint kept, and the inputs
of segments already back-propagated are freed. It never exceeds Chen's count.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
arXiv:2205.05198, section 4.1) count one transformer layer's activations in fp16 with
1-byte dropout masks: s·b·h·(34 + 5·a·s/h) bytes (`transformer_layer_activation_bytes`).
`layer_activation_terms` splits that count into its terms and parameterises what differs
from layout to layout: bytes per element and per mask, which dropouts exist, the
LayerNorm's saved statistics, and the attention kernel ("math": softmax and dropout
matrices of a·s²·b elements are saved; "flash": only Q, K, V, the output and a
log-sum-exp per row, Dao et al. 2022). `COURSE_LAYOUT` is the course GPT on a CPU.
"""

from __future__ import annotations

import math

# The course GPT (minidist.models) in float32 on a CPU: 4-byte elements; dropout only inside
# attention (`scaled_dot_product_attention(dropout_p=...)`), which then runs torch's math
# kernel and multiplies by a float32 mask (4 bytes per element); each LayerNorm also saves
# its mean and 1/std (float32, one per token). Without dropout the CPU runs a flash kernel.
COURSE_LAYOUT = dict(element_bytes=4, mask_bytes=4, residual_dropout=False, norm_stats_bytes=4)


def _segments(layers: int, segment: int) -> list[int]:
    """Sizes of the segments of `segment` consecutive layers, the last one possibly shorter."""
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    if segment < 1:
        raise ValueError(f"segment must be >= 1, got {segment}")
    return [min(segment, layers - start) for start in range(0, layers, segment)]


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


def chain_peak_bytes(layers: int, activation: int, boundary: int, segment: int | None) -> int:
    """The most a chain of `layers` identical layers holds during a step, exactly, when each
    layer's `activation` includes its own input (`boundary` bytes).

    Without recomputation: L·M_act, all alive at the end of forward. With segments (sizes n_j,
    j = 0..m-1, recomputed in backward from the last to the first): when segment j is
    recomputed, the inputs of segments 0..j are still kept and the segment's n_j·M_act are
    alive, its own input among them: j·M_in + n_j·M_act. The peak is the largest of those and of
    the m·M_in forward keeps.
    """
    if segment is None:
        return layers * activation
    sizes = _segments(layers, segment)
    during = [j * boundary + n * activation for j, n in enumerate(sizes)]
    return max(len(sizes) * boundary, *during)


def transformer_layer_activation_bytes(seq: int, batch: int, hidden: int, heads: int) -> float:
    """Korthikanti et al. 2022, eq. 1: fp16 activations of one layer, no parallelism."""
    return seq * batch * hidden * (34 + 5 * heads * seq / hidden)


def layer_activation_terms(
    seq: int,
    batch: int,
    hidden: int,
    heads: int,
    element_bytes: int = 2,
    mask_bytes: int = 1,
    attention: str = "math",
    attention_dropout: bool = True,
    residual_dropout: bool = True,
    norm_stats_bytes: int = 0,
) -> dict[str, int]:
    """Bytes one pre-LayerNorm transformer layer saves for backward, term by term.

    The defaults are Korthikanti et al.'s count (section 4.1; the terms add up to
    `transformer_layer_activation_bytes`). With s·b·h = `sbh` and a·s²·b = `ass`:
    attention block: QKV input sbh, Q and K 2sbh, softmax ass, its dropout mask ass and
    output ass, V sbh, projection input sbh, the dropout mask after it sbh; MLP: input
    sbh, GeLU input 4sbh, second linear's input 4sbh, dropout mask sbh; two LayerNorm
    inputs 2sbh. Elements are `element_bytes` each, masks `mask_bytes`.

    `attention="flash"`: a fused kernel saves Q, K, V, its output (the projection's input:
    one storage) and one float32 log-sum-exp per row and head, a·s·b, instead of any
    a·s²·b matrix; dropout there saves no mask (the kernel regenerates it).
    `norm_stats_bytes`: bytes of the mean and 1/std each LayerNorm saves per token (0 in
    the paper's count).
    """
    if attention not in ("math", "flash"):
        raise ValueError(f"attention must be 'math' or 'flash', got {attention!r}")
    e, m = element_bytes, mask_bytes
    sbh, sb = seq * batch * hidden, seq * batch
    ass = heads * seq * seq * batch
    terms = {"LayerNorm inputs": 2 * e * sbh}
    if norm_stats_bytes:
        terms["LayerNorm mean and 1/std"] = 2 * 2 * norm_stats_bytes * sb
    terms["QKV input"] = e * sbh
    if attention == "math":
        terms["Q, K"] = 2 * e * sbh
        terms["softmax output"] = e * ass
        if attention_dropout:
            terms["softmax dropout mask"] = m * ass
            terms["softmax dropout output"] = e * ass
        terms["V"] = e * sbh
        terms["projection input"] = e * sbh
    else:
        terms["Q, K, V"] = 3 * e * sbh
        terms["attention output = projection input"] = e * sbh
        terms["log-sum-exp"] = 4 * heads * seq * batch
    if residual_dropout:
        terms["attention dropout mask"] = m * sbh
    terms["MLP input"] = e * sbh
    terms["GeLU input"] = 4 * e * sbh
    terms["second linear input"] = 4 * e * sbh
    if residual_dropout:
        terms["MLP dropout mask"] = m * sbh
    return terms


def course_block_bytes(seq: int, batch: int, hidden: int, heads: int, dropout: bool) -> int:
    """`layer_activation_terms` for the course GPT's block on a CPU (`COURSE_LAYOUT`): the
    math kernel with a float32 mask when dropout is on, the flash kernel when it is off."""
    return sum(
        layer_activation_terms(
            seq,
            batch,
            hidden,
            heads,
            attention="math" if dropout else "flash",
            attention_dropout=dropout,
            **COURSE_LAYOUT,
        ).values()
    )


def boundary_bytes(seq: int, batch: int, hidden: int, element_bytes: int = 4) -> int:
    """A block's input (the residual stream between blocks): s·b·h elements."""
    return seq * batch * hidden * element_bytes
