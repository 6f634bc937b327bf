"""What tensor parallelism should communicate and store, as functions: defined once.

Shoeybi et al. 2019, "Megatron-LM", section 3: per transformer layer two all-reduces of the
activations (b·s·h elements) in forward (g after attention and after the MLP) and two in
backward (f before them). Around the layers: the vocab-parallel embedding's g in forward,
the output head's f in backward, and the vocab-parallel cross entropy's three all-reduces
of one value per token (max, sum of exp, target logit).

Parameters: the split ones (attention, MLP, embedding) are 1/t per rank, the vocabulary
padded to a multiple of t; layer norms, position embeddings and the row-parallel biases are
replicated on every tp rank (`params_per_rank`, `model_state_bytes_per_rank`).

Lesson 08 (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", section 3): bytes per step of TP inside and DP across
(`layout_bytes_sent_per_step`); the α-β time of TP's per-layer all-reduces and of DP's one
per step over a given link (`tp_comm_seconds_per_step`, `dp_comm_seconds_per_step`, with
lesson 00's `CostModel`), next to a layer's FLOPs (`transformer_layer_flops`).
"""

from __future__ import annotations

from .. import comm
from ..collectives.cost_model import CostModel
from ..data_parallel import theory as dp_theory


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


def replicated_params(layers: int, hidden: int, seq: int) -> int:
    """Parameters every tp rank holds whole: per layer two layer norms and the biases added
    after g (attention's projection, the MLP's second Linear); the position embedding and
    the final layer norm."""
    per_layer = 4 * hidden + hidden + hidden
    return layers * per_layer + seq * hidden + 2 * hidden


def params_per_rank(layers: int, hidden: int, vocab: int, seq: int, tp: int) -> int:
    """Parameters one tp rank holds for the course GPT (biases included)."""
    padded_vocab = -(-vocab // tp) * tp
    per_layer_split = (3 * hidden * hidden + 3 * hidden) + hidden * hidden  # qkv, proj weight
    per_layer_split += (4 * hidden * hidden + 4 * hidden) + 4 * hidden * hidden  # mlp
    return (
        layers * per_layer_split // tp
        + padded_vocab * hidden // tp  # tied embedding / head
        + replicated_params(layers, hidden, seq)
    )


def model_state_bytes_per_rank(
    layers: int, hidden: int, vocab: int, seq: int, tp: int, frozen: int = 0
) -> int:
    """Parameters, gradients and SGD momentum one tp rank holds, in float32 (4 bytes each).

    `params_per_rank` parameters, `frozen` of them (replicated, e.g. a frozen layer-norm
    bias) without gradient or momentum: the bytes `minidist.memory.model_state_bytes`
    measures on a rank of `TensorParallelGPT` trained with SGD + momentum.
    """
    params = params_per_rank(layers, hidden, vocab, seq, tp)
    return dp_theory.model_state_bytes_per_rank(params, params - frozen, "sgd")


def layout_bytes_sent_per_step(
    layers: int, batch: int, seq: int, hidden: int, tp: int, dp: int, trainable_per_rank: int
) -> float:
    """Bytes one rank sends per step with TP inside and DP across (pp = 1), float32.

    Each tp group trains on its data-parallel slice, `batch / dp` sequences of the global
    `batch`: tensor parallelism's all-reduces of activations over the tp group; then one
    all-reduce of this rank's `trainable_per_rank` gradient elements over its dp group,
    2(d-1)/d of them (lesson 01's data parallelism, on 1/t of the model).
    """
    if batch % dp:
        raise ValueError(f"layout_bytes_sent_per_step: batch={batch} not divisible by dp={dp}")
    tensor = bytes_sent_per_step(layers, batch // dp, seq, hidden, tp)
    return tensor + dp_theory.bytes_sent_per_step(trainable_per_rank, dp)


def transformer_layer_flops(batch: int, seq: int, hidden: int) -> float:
    """FLOPs of one transformer layer's forward and backward for `batch` sequences.

    Narayanan et al. 2021, appendix (FLOPs of a GPT layer): forward 24·b·s·h² (Q, K, V,
    the output projection and the 4h MLP: multiply-adds counted as 2) + 4·b·s²·h (scores and
    their weighted sum of values); backward twice the forward, 3x in all (no recomputation).
    """
    return 3 * (24 * batch * seq * hidden**2 + 4 * batch * seq**2 * hidden)


def tp_comm_seconds_per_step(
    cost: CostModel,
    layers: int,
    micro_batch: int,
    seq: int,
    hidden: int,
    tp: int,
    micro_batches: int = 1,
    element_size: int = 2,
) -> float:
    """α-β time of the tensor-parallel all-reduces one rank makes per step, over `cost`'s links.

    Per layer and micro-batch 2 in forward and 2 in backward, each of b·s·h elements (the
    embedding's, the head's and the cross entropy's few are left out: per layer is what
    scales). Each costs α + 2(t-1)/t·b·s·h·bytes / bandwidth (lesson 00's `CostModel`);
    a step of `micro_batches` micro-batches pays them that often.
    """
    size = micro_batch * seq * hidden * element_size
    one = float(cost.predict(comm.ring_bytes("all_reduce", size, tp)))
    return 4 * layers * micro_batches * one


def dp_comm_seconds_per_step(
    cost: CostModel, params_per_rank: float, dp: int, element_size: int = 2
) -> float:
    """α-β time of data parallelism's one all-reduce of the gradients per step."""
    size = params_per_rank * element_size
    return float(cost.predict(comm.ring_bytes("all_reduce", size, dp)))


def activation_bytes_per_layer(
    batch: int, seq: int, hidden: int, heads: int, tp: int, element_size: int = 4
) -> float:
    """Bytes one transformer layer saves for backward on a tp rank (no dropout, as measured
    with `SavedActivations` on this course's CPU kernels), after Korthikanti et al. 2022,
    section 4.1: what sits outside the tensor-parallel regions is replicated on every rank
    (the two layer norms' inputs and outputs, 4·sbh, and their statistics, 4·sb), what sits
    inside is split t ways (Q, K, V, the attention output and the two MLP activations,
    12·sbh, plus attention's log-sum-exp, b·a·s).
    """
    sbh, sb = seq * batch * hidden, seq * batch
    replicated = 4 * sbh + 4 * sb
    split = 12 * sbh + batch * heads * seq
    return element_size * (replicated + split / tp)
