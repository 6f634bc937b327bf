"""What sequence parallelism should communicate and store, as functions: defined once.

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
section 4.2.2. Tensor parallelism (lesson 07) leaves the layer norms, the residual adds and
the dropouts between its regions replicated on every tp rank; sequence parallelism splits
them along the sequence. Each region's all-reduce becomes a reduce-scatter (into the
sequence-parallel part) and an all-gather (out of it): per rank (t-1)/t + (t-1)/t of the
activation, the all-reduce's 2(t-1)/t. Backward mirrors forward, and Korthikanti's rule of
storing the layer norm's output as this rank's block adds one all-gather per region in
backward (to rebuild the Linear's input for its weight gradient).

Activations per layer (section 4, Table 2), in the paper's 16-bit terms with dropout:
- tensor parallelism: s·b·h·(10 + 24/t + 5·a·s/(h·t)) bytes;
- tensor + sequence parallelism: s·b·h·(34/t + 5·a·s/(h·t)) bytes: everything split.
`korthikanti_terms` gives them term by term. This course's CPU kernels (float32, no
dropout, attention that keeps its log-sum-exp rather than the a·s² scores) save other
amounts; `activation_terms` gives those, term by term, and the tests measure them.
"""

from __future__ import annotations

from .. import comm


def _tp(tp: int) -> int:
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ValueError(f"tp must be a positive int, got {tp!r}")
    return tp


def collectives_per_step(layers: int, batch: int, seq: int, hidden: int) -> list[tuple]:
    """[(op, phase, count, elements of the full tensor)] of one step's activations.

    Per layer: forward 2 all-gathers (into attention, into the MLP) and 2 reduce-scatters
    (out of each); backward 2 reduce-scatters (the gathers' backward), 2 all-gathers (the
    reduce-scatters' backward) and 2 all-gathers that rebuild the stored blocks. Around the
    layers: the embedding's reduce-scatter (all-gather in backward) and the head's all-gather
    (reduce-scatter in backward). The loss: lesson 07's three all-reduces of b·s values.
    """
    act = batch * seq * hidden
    return [
        ("all_gather", "forward", 2 * layers + 1, act),  # attention, MLP, head
        ("reduce_scatter", "forward", 2 * layers + 1, act),  # attention, MLP, embedding
        ("reduce_scatter", "backward", 2 * layers + 1, act),
        ("all_gather", "backward", 2 * layers + 1, act),
        ("all_gather", "backward re-gather", 2 * layers, act),  # section 4.2.2
        ("all_reduce", "cross entropy", 3, batch * seq),
    ]


def bytes_sent_per_step(
    layers: int, batch: int, seq: int, hidden: int, tp: int, replicated_trainable: int = 0
) -> float:
    """Bytes one rank sends per step (float32, ring model), plus the all-reduce of the
    `replicated_trainable` gradient elements (layer norms, biases after a region, position
    embedding): under sequence parallelism each rank's covers only its block."""
    t = _tp(tp)
    acts = sum(
        count * comm.ring_bytes(op, 4 * elements, t)
        for op, _, count, elements in collectives_per_step(layers, batch, seq, hidden)
    )
    return acts + comm.ring_bytes("all_reduce", 4 * replicated_trainable, t)


def korthikanti_terms(
    seq: int, batch: int, hidden: int, heads: int, tp: int, sequence_parallel: bool
) -> dict[str, float]:
    """Bytes one transformer layer stores per rank, the paper's terms (16-bit, dropout).

    Outside the regions (10·s·b·h): the two layer norms' inputs (4·sbh), the inputs of
    attention's QKV and of the MLP (4·sbh), the two dropout masks after them (2·sbh).
    Inside (24·s·b·h, split t ways): attention's Q and K (4), V (2), the output
    projection's input (2) and the MLP's two 4h activations (16); and 5·a·s²·b for the
    softmax, its dropout mask and the dropout's output.
    """
    t = _tp(tp)
    sbh = seq * batch * hidden
    outside = 1 / t if sequence_parallel else 1.0
    return {
        "layer norm inputs": 4 * sbh * outside,
        "region inputs": 4 * sbh * outside,
        "dropout masks": 2 * sbh * outside,
        "inside the regions": 24 * sbh / t,
        "attention scores": 5 * heads * seq * seq * batch / t,
    }


def activation_terms(
    seq: int,
    batch: int,
    hidden: int,
    heads: int,
    tp: int,
    sequence_parallel: bool,
    element_size: int = 4,
) -> dict[str, float]:
    """Bytes one layer saves per rank on this course's kernels, under `korthikanti_terms`'
    names (lesson 07's `megatron.theory.activation_bytes_per_layer` is their sum without
    sequence parallelism):

    - layer norm inputs: 2·s·b·h, with each norm's mean and 1/σ, 4·s·b;
    - region inputs (the layer norms' outputs, which QKV and the MLP's first Linear keep,
      as this rank's block under sequence parallelism): 2·s·b·h;
    - dropout masks: none (the course GPT has dropout inside attention only, off here);
    - inside the regions, split t ways: Q, K, V, attention's output and the MLP's two 4h
      activations, 12·s·b·h;
    - attention scores: the fused attention keeps its log-sum-exp, b·a·s, not the a·s²·b
      scores (split t ways with the heads).
    """
    t = _tp(tp)
    sbh, sb = seq * batch * hidden, seq * batch
    outside = element_size / t if sequence_parallel else element_size
    return {
        "layer norm inputs": (2 * sbh + 4 * sb) * outside,
        "region inputs": 2 * sbh * outside,
        "dropout masks": 0.0,
        "inside the regions": element_size * 12 * sbh / t,
        "attention scores": element_size * batch * heads * seq / t,
    }


def activation_bytes_per_layer(
    seq: int,
    batch: int,
    hidden: int,
    heads: int,
    tp: int,
    sequence_parallel: bool = True,
    element_size: int = 4,
) -> float:
    """The sum of `activation_terms`."""
    terms = activation_terms(seq, batch, hidden, heads, tp, sequence_parallel, element_size)
    return sum(terms.values())
