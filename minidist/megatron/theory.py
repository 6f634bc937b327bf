"""What tensor parallelism should communicate and store, as functions: defined once.

Shoeybi et al. 2019, "Megatron-LM", section 3: per transformer layer two all-reduces of the
activations (b·s·h elements) in forward (g after attention and after the MLP) and two in
backward (f before them). Around the layers: the vocab-parallel embedding's g in forward,
the output head's f in backward, and the vocab-parallel cross entropy's three all-reduces
of one value per token (max, sum of exp, target logit).

Parameters: the split ones (attention, MLP, embedding) are 1/t per rank, the vocabulary
padded to a multiple of t; layer norms, position embeddings and the row-parallel biases are
replicated on every tp rank.
"""

from __future__ import annotations

from .. import comm


def all_reduces_per_step(
    layers: int, batch: int, seq: int, hidden: int
) -> dict[str, tuple[int, int]]:
    """{phase: (number of all-reduces, elements each)} for one forward and backward."""
    activations = batch * seq * hidden
    return {
        "forward": (2 * layers + 1, activations),  # g per attention, per MLP, embedding
        "backward": (2 * layers + 1, activations),  # f per attention, per MLP, output head
        "cross_entropy": (3, batch * seq),  # max, sum of exp, target logit
    }


def bytes_sent_per_step(layers: int, batch: int, seq: int, hidden: int, tp: int) -> float:
    """Bytes one rank sends per step on a ring (float32): 2(t-1)/t of every all-reduce."""
    return sum(
        count * comm.ring_bytes("all_reduce", 4 * elements, tp)
        for count, elements in all_reduces_per_step(layers, batch, seq, hidden).values()
    )


def params_per_rank(layers: int, hidden: int, vocab: int, seq: int, tp: int) -> int:
    """Parameters one tp rank holds for the course GPT (biases included)."""
    padded_vocab = -(-vocab // tp) * tp
    per_layer_split = (3 * hidden * hidden + 3 * hidden) + hidden * hidden  # qkv, proj weight
    per_layer_split += (4 * hidden * hidden + 4 * hidden) + 4 * hidden * hidden  # mlp
    per_layer_replicated = 4 * hidden + hidden + hidden  # two layer norms, proj and mlp biases
    return (
        layers * (per_layer_split // tp + per_layer_replicated)
        + padded_vocab * hidden // tp  # tied embedding / head
        + seq * hidden  # position embedding
        + 2 * hidden  # final layer norm
    )
