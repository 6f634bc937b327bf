"""The mistakes the lesson 10 checkers recognise (`check.py`), each a formula and its message.

`RANK_FAMILIES`: wrong layouts of Megatron-LM's t × p × d grid (Narayanan et al. 2021,
section 3) as rank formulas. `variant_bytes`: the bytes per step by group kind with one
mistake switched on (the default is `theory.bytes_sent_per_step`, written out the way the
exercise asks for it), and `BYTE_MISTAKES`: each mistake's switches and message.
"""

from __future__ import annotations

from .. import comm
from ..megatron.theory import all_reduces_per_step

RIGHT = "pp_rank·t·d + dp_rank·t + tp_rank"
RANK_FAMILIES = [
    (
        lambda i, j, k, t, p, d: j * t * d + i * d + k,
        "tp and dp are swapped: your data-parallel replicas sit on neighbouring ranks and a tp "
        "group is every d-th rank. Megatron-LM puts the tp group on t consecutive ranks (one "
        "node, the fastest links: TP all-reduces every layer), so tp_rank is the fastest-moving "
        f"index: rank = {RIGHT}.",
    ),
    (
        lambda i, j, k, t, p, d: k * t * p + j * t + i,
        "your pipeline stages are contiguous (one replica's stages next to each other, replicas "
        "outermost). In Megatron-LM a stage is a block of n/p = t·d consecutive ranks and a "
        "pipeline group takes every (n/p)-th rank: stages span nodes, where only point-to-point "
        f"activations travel. rank = {RIGHT}.",
    ),
    (
        lambda i, j, k, t, p, d: i * p * d + j * d + k,
        "tp_rank is your slowest-moving index: a tp group is spread over the whole world. The tp "
        f"group is t consecutive ranks (one node): rank = {RIGHT}.",
    ),
    (
        lambda i, j, k, t, p, d: j * t * p + k * t + i,
        "a stage is a block of t·d ranks (its tp groups for every replica); you stepped stages "
        f"by t·p, which is the same only when p = d. rank = {RIGHT}.",
    ),
    (
        lambda i, j, k, t, p, d: j * t * d + k * d + i,
        "inside a stage's block the dp groups take every t-th rank: dp_rank steps by t (one tp "
        f"group), not by d. rank = {RIGHT}.",
    ),
    (
        lambda i, j, k, t, p, d: (p - 1 - j) * t * d + k * t + i,
        "your stages run backwards: stage 0 (the embedding) is the first block, ranks "
        f"0..t·d-1. rank = {RIGHT}.",
    ),
    (
        lambda i, j, k, t, p, d: j * t * d + k * t + i + 1,
        "your ranks count from 1; they count from 0 (rank 0 is tp 0, stage 0, replica 0).",
    ),
]


def stage_blocks(stage: int, pp: int, layers: int, boundaries: str = "round") -> int:
    """The number of blocks on `stage`: boundaries round(k·L/p) (the library), or the
    mistakes: L // p blocks each, floor(k·L/p), ceil(k·L/p)."""
    if boundaries == "floor_div":
        return layers // pp
    f = {"round": round, "floor": lambda x: int(x), "ceil": lambda x: -int(-x // 1)}[boundaries]
    return f((stage + 1) * layers / pp) - f(stage * layers / pp)


def variant_bytes(
    stage,
    tp,
    pp,
    dp,
    trainable,
    layers,
    batch,
    seq,
    hidden,
    vocab,
    *,
    boundaries="round",
    tp_ring="t",
    tp_payload=False,
    extras_everywhere=False,
    per_replica=True,
    tied="shard",
    pp_both=False,
    dp_form="rs+ag",
    dp_unit=4,
    tp_in_dp=False,
    cross_entropy=True,
    pp_split=False,
) -> dict[str, float]:
    """{"tp", "pp", "dp"} bytes of one rank of `stage`, with the named mistakes switched on."""
    b = batch // dp if per_replica else batch
    n = stage_blocks(stage, pp, layers, boundaries)
    first, last = stage == 0, stage == pp - 1
    if extras_everywhere:
        first = last = True
    calls = all_reduces_per_step(n, b, seq, hidden)
    counts = [
        (2 * n + first, calls["forward"][1]),
        (2 * n + last, calls["backward"][1]),
        (3 * last * cross_entropy, calls["cross_entropy"][1]),
    ]
    ring = {"t": tp, "d": dp}[tp_ring]
    per = (
        (lambda e: 4 * e) if tp_payload else (lambda e: comm.ring_bytes("all_reduce", 4 * e, ring))
    )
    tp_bytes = sum(c * per(e) for c, e in counts)
    act = 4 * b * seq * hidden // (tp if pp_split else 1)
    ends = stage == 0 or stage == pp - 1
    pp_bytes = 2 * act if pp_both and pp > 1 else act * (stage < pp - 1) + act * (stage > 0)
    shard = {
        "shard": -(-vocab // tp),
        "unpadded": vocab // tp,
        "full": vocab,
        "every": -(-vocab // tp),
        "p1": -(-vocab // tp),
        "none": 0,
    }[tied]
    if (tied == "every" and pp > 1) or (tied == "p1" and ends) or (ends and pp > 1):
        pp_bytes += comm.ring_bytes("all_reduce", 4 * shard * hidden, 2)
    padded = -(-trainable // dp) * dp
    dp_bytes = {
        "rs+ag": 2 * comm.ring_bytes("all_gather", dp_unit * padded, dp),
        "rs": comm.ring_bytes("reduce_scatter", dp_unit * padded, dp),
        "all_reduce": comm.ring_bytes("all_reduce", dp_unit * trainable, dp),
        "payload": 2 * dp_unit * padded,
        "2ar": 2 * comm.ring_bytes("all_reduce", dp_unit * padded, dp),
        "2ar_unpadded": 2 * comm.ring_bytes("all_reduce", dp_unit * trainable, dp),
    }[dp_form]
    return {"tp": tp_bytes, "pp": pp_bytes, "dp": dp_bytes + tp_bytes * tp_in_dp}


# (key, switches, message): the first whose bytes match the learner's on that key names it.
BYTE_MISTAKES = [
    (
        "tp",
        dict(boundaries="floor_div"),
        "your stage holds layers // pp blocks: when p does not divide the layers the stages "
        "differ; the boundaries are round(k·layers/pp), k = 0..p (theory.stage_layers).",
    ),
    (
        "tp",
        dict(boundaries="floor"),
        "your block boundaries are floor(k·layers/pp); the library rounds: round(k·layers/pp).",
    ),
    (
        "tp",
        dict(boundaries="ceil"),
        "your block boundaries are ceil(k·layers/pp); the library rounds: round(k·layers/pp).",
    ),
    (
        "tp",
        dict(tp_ring="d"),
        "your tp bytes are those of a ring of d ranks: tensor parallelism's all-reduces go over "
        "the tp group, t ranks, 2(t-1)/t of each.",
    ),
    (
        "tp",
        dict(tp_payload=True),
        "your tp bytes are the all-reduces' payloads: on a ring a rank sends 2(t-1)/t of each "
        "all-reduce's bytes (comm.ring_bytes), not the tensor once.",
    ),
    (
        "tp",
        dict(extras_everywhere=True),
        "the embedding's forward all-reduce is the first stage's only and the head's backward "
        "one and the cross entropy's three the last stage's only; you counted them on every "
        "stage.",
    ),
    (
        "tp",
        dict(cross_entropy=False),
        "the cross entropy's three all-reduces of b·s floats (max, sum of exponentials, target "
        "logit) on the last stage are missing.",
    ),
    (
        "tp",
        dict(per_replica=False),
        "your tp bytes are for the global batch: each of the d replicas trains on B/d "
        "sequences, so its activations are d times smaller.",
    ),
    (
        "pp",
        dict(per_replica=False),
        "your pp bytes are for the global batch: each of the d replicas trains on B/d "
        "sequences, so its activations are d times smaller.",
    ),
    (
        "pp",
        dict(pp_split=True),
        "you divided the boundary activations by t: every tp rank of a stage holds the whole "
        "b·s·h activation and sends its own copy to its peer in the next stage (Megatron-LM's "
        "scatter/gather of it over the tp group is not done here).",
    ),
    (
        "pp",
        dict(tied="none"),
        "the tied embedding's all-reduce is missing: the first and last stages each hold the "
        "embedding (the input and the output head) and all-reduce its gradient, their "
        "vocabulary shard V/t·h, over the embedding group of 2.",
    ),
    (
        "pp",
        dict(tied="full"),
        "the tied embedding's all-reduce carries the rank's vocabulary shard, padded V/t rows "
        "of h, not the whole V·h: tensor parallelism split the embedding first.",
    ),
    (
        "pp",
        dict(tied="unpadded"),
        "the tied embedding's shard is the padded vocabulary's: ceil(V/t)·h (V padded to a "
        "multiple of t), not floor(V/t)·h.",
    ),
    (
        "pp",
        dict(tied="every"),
        "only the first and the last stage hold the tied embedding; the middle stages have no "
        "embedding all-reduce.",
    ),
    (
        "pp",
        dict(tied="p1"),
        "with p = 1 the one stage holds the embedding once: there is no second copy to "
        "all-reduce with.",
    ),
    (
        "pp",
        dict(pp_both=True),
        "the first stage sends no gradient back (nothing before it) and the last no activation "
        "forward: the ends send b·s·h once, the middle stages twice.",
    ),
    (
        "dp",
        dict(tp_in_dp=True),
        "your dp bytes include the tp all-reduces: those go over the tp group; the dp group "
        "carries only ZeRO-1's reduce-scatter and all-gather.",
    ),
    (
        "dp",
        dict(dp_form="rs"),
        "ZeRO-1 sends twice that: the reduce-scatter of the gradients and the all-gather of the "
        "updated parameters, (d-1)/d of the padded flat each.",
    ),
    (
        "dp",
        dict(dp_form="all_reduce"),
        "an all-reduce of the unpadded gradients moves almost the same bytes, but ZeRO-1 "
        "reduce-scatters the flat padded to a multiple of d, then all-gathers it.",
    ),
    (
        "dp",
        dict(dp_form="2ar"),
        "you counted ZeRO-1's reduce-scatter and all-gather as two all-reduces: each moves "
        "(d-1)/d of the padded flat, together what one all-reduce moves, 2(d-1)/d.",
    ),
    (
        "dp",
        dict(dp_form="2ar_unpadded"),
        "you counted ZeRO-1's reduce-scatter and all-gather as two all-reduces: each moves "
        "(d-1)/d of the flat padded to a multiple of d, together 2(d-1)/d of it.",
    ),
    ("dp", dict(dp_unit=1), "your dp bytes are elements: float32 is 4 bytes each."),
    (
        "dp",
        dict(dp_form="payload"),
        "your dp bytes are the payloads: on a ring a reduce-scatter or an all-gather sends "
        "(d-1)/d of the flat's bytes per rank (comm.ring_bytes), not all of them.",
    ),
]
