"""What 3D parallelism should communicate and store, per rank, as functions: defined once.

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (SC), sections 2-3: n = t·p·d ranks; each rank holds 1/t of the layers of one
pipeline stage of one of d replicas. Per step one rank sends, by group kind:

- tp: the Megatron all-reduces of its stage's layers (Shoeybi et al. 2019, section 3; lesson
  07's `minidist.megatron.theory.all_reduces_per_step`, restricted to the stage): per layer
  two of b·s·h elements in forward and two in backward, the embedding's g on the first stage,
  the head's f and the cross entropy's three of b·s on the last; b = B/d, the replica's slice.
- pp: the activations forward and their gradients backward, b·s·h each way (not split by
  t: every tp rank sends its whole copy, Megatron-LM without the scatter/gather
  optimisation), and the tied embedding's all-reduce between the first and the last stage,
  of the rank's vocabulary shard, V/t·h (lesson 09's `p2p_bytes_sent_per_step`).
- dp: ZeRO-1 over the d replicas of the rank's shard of the stage (Rajbhandari et al. 2020,
  section 5.1): a reduce-scatter of the flat, padded gradients and an all-gather of the
  updated parameters, (d-1)/d of it each (`minidist.zero.theory.bytes_sent_per_step`, stage 1).

Not counted: the loss's broadcast along the pipeline ("pp-loss"), the mean of the loss over
the replicas ("loss") and the comparison contract's gathers ("full-state").

Memory (`model_state_bytes_per_rank`): the stage's parameters on this tp rank and their
gradients, float32, plus what ZeRO-1 keeps per rank: its fp32 chunk of the flat parameters,
the chunk's gradient (the reduce-scatter's output) and SGD's momentum of the chunk, 1/d of
the padded flat each.
"""

from __future__ import annotations

from .. import comm
from ..megatron import theory as tp_theory
from ..pipeline.theory import p2p_bytes_sent_per_step
from ..zero import theory as zero_theory

KINDS = ("tp", "pp", "dp")  # the group kinds a 3D step sends on (the embedding group: "pp")


def stage_layers(layers: int, pp: int) -> list[range]:
    """The blocks of each stage: dealt out as evenly as possible, as `split_tensor_parallel_gpt`."""
    if not 1 <= pp <= layers:
        raise ValueError(f"stage_layers: pp={pp} must be between 1 and layers={layers}")
    bounds = [round(k * layers / pp) for k in range(pp + 1)]
    return [range(bounds[k], bounds[k + 1]) for k in range(pp)]


def padded_vocab(vocab: int, tp: int) -> int:
    return -(-vocab // tp) * tp


def tp_bytes_sent_per_step(
    stage: int, pp: int, layers: int, batch: int, seq: int, hidden: int, tp: int
) -> float:
    """Bytes a rank of stage `stage` sends on its tp group per step, `batch` its replica's."""
    n = len(stage_layers(layers, pp)[stage])
    first, last = stage == 0, stage == pp - 1
    full = tp_theory.all_reduces_per_step(n, batch, seq, hidden)
    counts = {
        "forward": (2 * n + first, full["forward"][1]),  # g per attention, per MLP, embedding
        "backward": (2 * n + last, full["backward"][1]),  # f per attention, per MLP, head
        "cross_entropy": (3 * last, full["cross_entropy"][1]),  # max, sum of exp, target
    }
    return sum(c * comm.ring_bytes("all_reduce", 4 * e, tp) for c, e in counts.values())


def pp_bytes_sent_per_step(
    stage: int, pp: int, batch: int, seq: int, hidden: int, vocab: int, tp: int
) -> float:
    """Bytes a rank sends to its neighbour stages and on its embedding group per step."""
    return p2p_bytes_sent_per_step(stage, pp, batch, seq, hidden, padded_vocab(vocab, tp) // tp)


def dp_bytes_sent_per_step(trainable_per_rank: int, dp: int) -> float:
    """ZeRO-1 over d: reduce-scatter + all-gather of the padded flat of this rank's shard."""
    padded = zero_theory.padded_numel([trainable_per_rank], dp)
    return zero_theory.bytes_sent_per_step(padded, dp, stage=1)


def params_per_rank(
    stage: int, pp: int, layers: int, hidden: int, vocab: int, seq: int, tp: int
) -> int:
    """Parameters one rank of stage `stage` holds: 1/t of its blocks' split weights, its
    blocks' replicated ones; the first stage the vocabulary shard and the position embedding,
    the last the final norm and its own copy of the vocabulary shard (tied to the first's)."""
    n = len(stage_layers(layers, pp)[stage])
    first, last = stage == 0, stage == pp - 1
    blocks = tp_theory.params_per_rank(n, hidden, vocab, seq, tp)  # + embedding, pos, ln_f
    blocks -= padded_vocab(vocab, tp) * hidden // tp + seq * hidden + 2 * hidden
    shard = padded_vocab(vocab, tp) * hidden // tp
    shared_copies = 1 if first and last else first + last  # one module when p = 1
    return blocks + shard * shared_copies + first * seq * hidden + last * 2 * hidden


def trainable_per_rank(
    stage: int, pp: int, layers: int, hidden: int, vocab: int, seq: int, tp: int, frozen: int = 0
) -> int:
    """`params_per_rank` less the `frozen` ones (the course GPT's `ln_f.bias`, replicated,
    on the last stage): what has a gradient and what ZeRO-1 flattens."""
    params = params_per_rank(stage, pp, layers, hidden, vocab, seq, tp)
    return params - frozen * (stage == pp - 1)


def bytes_sent_per_step(
    stage: int,
    pp: int,
    layers: int,
    batch: int,
    seq: int,
    hidden: int,
    vocab: int,
    tp: int,
    dp: int,
    frozen: int = 0,
) -> dict[str, float]:
    """{group kind: bytes} one rank of stage `stage` sends per step; `batch` is the global
    batch (each replica trains on batch / dp sequences); `frozen` parameters of the last
    stage have no gradient to reduce."""
    if batch % dp:
        raise ValueError(f"bytes_sent_per_step: batch={batch} not divisible by dp={dp}")
    b = batch // dp
    trainable = trainable_per_rank(stage, pp, layers, hidden, vocab, seq, tp, frozen)
    return {
        "tp": tp_bytes_sent_per_step(stage, pp, layers, b, seq, hidden, tp),
        "pp": pp_bytes_sent_per_step(stage, pp, b, seq, hidden, vocab, tp),
        "dp": dp_bytes_sent_per_step(trainable, dp),
    }


def model_state_bytes_per_rank(params: int, trainable: int, dp: int) -> int:
    """This rank's `params` elements (4 bytes each), the gradients of its `trainable` ones,
    and ZeRO-1's fp32 chunk of them, the chunk's gradient and SGD's momentum of the chunk:
    3 · ceil(trainable / d) elements."""
    chunk = -(-trainable // dp)
    return 4 * (params + trainable + 3 * chunk)
