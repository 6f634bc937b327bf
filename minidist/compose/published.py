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

`plan_llama3()` plans each on lesson 17's engine rules (`compose.theory`): model states per
GPU and bytes per group kind of a first-stage GPU, its FLOPs per step (`planner.llama`), and
the step time and tokens per second per GPU the published TFLOP/s imply. Two departures,
named: the engine's stages are equal, so 128 layers are planned (Meta took one layer off the
first and the last stage, 126); and the engine shards optimizer states over dp × cp (ZeRO-1)
where Meta sharded parameters and gradients too (FSDP, section 3.3.2), so its model states
are an upper bound on Meta's. Why TP stays at 8: it all-reduces (or all-gathers and
reduce-scatters) activations twice per layer in both directions, which only NVLink inside
an 8-GPU node carries at the rate compute needs; why CP comes only at 128K tokens: at 8K the
attention is a small share of the FLOPs and the ring's K/V blocks would not hide behind it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..planner.llama import layer_flops
from ..planner.spec import ModelSpec
from .dims import ParallelDims
from .theory import cp_bytes, dp_bytes, model_state_bytes, pp_bytes, tp_bytes


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
    Llama3Row(16384, 8, 16, 16, 8, 131072, 16, 380.0),
)
LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, VOCAB = 128, 16384, 128, 8, 53248, 128256


def spec(seq: int) -> ModelSpec:
    return ModelSpec(arch="llama", layers=LAYERS, hidden=HIDDEN, heads=HEADS, vocab=VOCAB,
                     seq=seq, kv_heads=KV_HEADS, ffn=FFN)  # fmt: skip


def plan_row(row: Llama3Row) -> dict:
    """{name: value} of a first-stage GPU of `row`: model states (GB), bytes sent per step per
    group kind (GB), FLOPs per step, and the step time and tokens/s per GPU at the published
    TFLOP/s."""
    dims = ParallelDims(dp_shard=row.dp, cp=row.cp, tp=row.tp, sp=True, pp=row.pp)
    model = spec(row.seq).meta_model()
    m = row.per_dp  # one sequence per micro-batch, as Meta's schedule runs them
    states = model_state_bytes(model, dims, "bf16")
    args = (model, dims, 1, m, "bf16")
    sent = {"dp": dp_bytes(model, dims, "bf16"), "tp": tp_bytes(*args), "pp": pp_bytes(*args),
            "cp": cp_bytes(*args)}  # fmt: skip
    flops = m * layer_flops(spec(row.seq), 1, row.seq) * (LAYERS // row.pp) / (row.tp * row.cp)
    step_s = flops / (row.tflops * 1e12)
    tokens = row.dp * row.per_dp * row.seq
    out = {f"states_{k}_gb": v / 1e9 for k, v in states.items()}
    out.update({f"sent_{k}_gb": v / 1e9 for k, v in sent.items()})
    out.update(flops_per_step=flops, step_s=step_s, tokens_per_s_per_gpu=tokens / step_s / row.gpus)
    return out


def plan_llama3() -> list[tuple[Llama3Row, dict]]:
    return [(row, plan_row(row)) for row in LLAMA3_405B_TABLE4]
