"""Llama 3 405B's three published layouts, planned (Dubey et al. 2024, "The Llama 3 Herd of
Models", Table 4 and section 3.3.2).

Meta trained the 405B model (126 layers, hidden 16,384, 128 query and 8 KV heads, SwiGLU of
53,248, vocabulary 128,256; section 3.2, Table 3) with TP 8 (sequence parallelism inside
it), PP 16, CP 1 or 16 and FSDP-style data parallelism, in bf16, 16M tokens per step:

| GPUs   | TP | CP | PP | DP  | sequence | sequences per DP rank | TFLOP/s per GPU |
|--------|----|----|----|-----|----------|-----------------------|-----------------|
| 8,192  | 8  | 1  | 16 | 64  | 8,192    | 32                    | 430             |
| 16,384 | 8  | 1  | 16 | 128 | 8,192    | 16                    | 400             |
| 16,384 | 8  | 16 | 16 | 8   | 131,072  | 16                    | 380             |

Table 4 prints DP = 4 in its third row; 16,384 GPUs / (8 · 16 · 16) = 8, and only 8 gives
its 16M tokens per step (8 · 16 sequences of 131,072), so 8 is planned here.

`plan_llama3()` plans each row for a first-stage GPU: model states per GPU on lesson 17's
engine rules (`compose.theory`); the bytes each group kind sends per step as Meta sends
them; its FLOPs per step (`planner.llama`), and the step time and tokens per second per GPU
the published TFLOP/s imply. Departures, named:
- the engine's stages are equal, so 128 layers are planned (Meta took one layer off the
  first and the last stage, 126);
- the engine shards optimizer states over dp × cp (ZeRO-1) where Meta sharded parameters
  and gradients too (FSDP, section 3.3.2), so its model states are an upper bound on Meta's;
- the bytes are not the engine's (`theory.planned`, which the lesson's runs equal): tp
  gathers each shared input once per layer, as Megatron does (`megatron_tp_bytes`; the
  engine gathers once per projection, 19 collectives a layer against 10); cp all-gathers K
  and V at the width of the 8 KV heads and reduce-scatters their gradients, Meta's choice
  (section 3.3.2; the engine passes K and V round a ring, expanded to the query heads);
  pipeline activations and FSDP's all-gather are bf16, the gradients' reduce-scatter fp32
  (section 3.3.2, numerical stability). `plan_row` returns the engine's tp and cp bytes
  too (`engine_tp_gb`, `engine_cp_gb`), for the comparison.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ledger import ring_bytes
from ..planner.llama import layer_flops
from ..planner.spec import ModelSpec
from .dims import ParallelDims
from .theory import cp_bytes, model_state_bytes, rank_params, tp_bytes


@dataclass(frozen=True)
class Llama3Row:
    gpus: int
    tp: int
    cp: int
    pp: int
    dp: int
    seq: int
    per_dp: int  # sequences per data-parallel rank per step
    tflops: float  # published, per GPU


LLAMA3_405B_TABLE4 = (
    Llama3Row(8192, 8, 1, 16, 64, 8192, 32, 430.0),
    Llama3Row(16384, 8, 1, 16, 128, 8192, 16, 400.0),
    Llama3Row(16384, 8, 16, 16, 8, 131072, 16, 380.0),  # Table 4 prints DP = 4 (see above)
)
LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, VOCAB = 128, 16384, 128, 8, 53248, 128256


def spec(seq: int) -> ModelSpec:
    return ModelSpec(
        arch="llama",
        layers=LAYERS,
        hidden=HIDDEN,
        heads=HEADS,
        vocab=VOCAB,
        seq=seq,
        kv_heads=KV_HEADS,
        ffn=FFN,
    )


def megatron_tp_bytes(row: Llama3Row) -> float:
    """Tensor and sequence parallelism as Megatron runs it (Korthikanti et al. 2022, section
    4.2.2), per layer and micro-batch of one sequence: the attention's and the MLP's input
    all-gathered once each in forward and again in backward, their gradients
    reduce-scattered; each block's output reduce-scattered in forward, its gradient
    all-gathered in backward. 10 collectives of (s/c)·h bf16 elements."""
    size = 2 * row.seq // row.cp * HIDDEN
    layer = 6 * ring_bytes("all_gather", size, row.tp) + 4 * ring_bytes(
        "reduce_scatter", size, row.tp
    )
    return row.per_dp * (LAYERS // row.pp) * layer


def llama3_cp_bytes(row: Llama3Row) -> float:
    """Context parallelism as Meta runs it (section 3.3.2), per layer and micro-batch: K and V
    (this tp rank's KV_HEADS / tp heads, whole sequence, bf16) all-gathered over cp in forward,
    their gradients reduce-scattered in backward."""
    kv = 2 * 2 * row.seq * (KV_HEADS // row.tp) * (HIDDEN // HEADS)
    layer = ring_bytes("all_gather", kv, row.cp) + ring_bytes("reduce_scatter", kv, row.cp)
    return row.per_dp * (LAYERS // row.pp) * layer


def plan_row(row: Llama3Row) -> dict:
    """{name: value} of a first-stage GPU of `row`: model states (GB), bytes sent per step per
    group kind (GB, `sent_*`, as Meta sends them; `engine_tp_gb` and `engine_cp_gb` on the
    engine's rules), FLOPs per step, and the step time and tokens/s per GPU at the published
    TFLOP/s."""
    dims = ParallelDims(dp_shard=row.dp, cp=row.cp, tp=row.tp, sp=True, pp=row.pp)
    model = spec(row.seq).meta_model()
    m = row.per_dp  # one sequence per micro-batch, as Meta's schedule runs them
    states = model_state_bytes(model, dims, "bf16")
    shard = rank_params(model, dims)["dense_trainable"]
    dp = ring_bytes("reduce_scatter", 4 * shard, row.dp * row.cp)  # fp32 gradients
    dp += ring_bytes("all_gather", 2 * shard, row.dp * row.cp)  # bf16 parameters
    sent = {
        "dp": dp,
        "tp": megatron_tp_bytes(row),
        "cp": llama3_cp_bytes(row),
        "pp": m * row.seq // (row.cp * row.tp) * HIDDEN * 2,
    }
    args = (model, dims, 1, m, "bf16")
    flops = m * layer_flops(spec(row.seq), 1, row.seq) * (LAYERS // row.pp) / (row.tp * row.cp)
    step_s = flops / (row.tflops * 1e12)
    tokens = row.dp * row.per_dp * row.seq
    out = {f"states_{k}_gb": v / 1e9 for k, v in states.items()}
    out.update({f"sent_{k}_gb": v / 1e9 for k, v in sent.items()})
    out.update(engine_tp_gb=tp_bytes(*args) / 1e9, engine_cp_gb=cp_bytes(*args) / 1e9)
    out.update(flops_per_step=flops, step_s=step_s, tokens_per_s_per_gpu=tokens / step_s / row.gpus)
    return out


def plan_llama3() -> list[tuple[Llama3Row, dict]]:
    return [(row, plan_row(row)) for row in LLAMA3_405B_TABLE4]
