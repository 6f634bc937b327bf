"""Published tables the planner reproduces from its own arithmetic (notebook 13 shows each
beside its source; `tests/test_planner.py` checks them).

- ZeRO (Rajbhandari et al. 2020), Table 1: model-state GB per device of a 7.5B model with
  mixed-precision Adam (K = 12) by data-parallel degree and stage; Table 2: the largest model
  per model-parallel degree on 64-way data parallelism and 32 GB V100s (its theory half).
- Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters
  Using Megatron-LM"), Table 1: ten GPT layouts on A100 80 GB (sequence 2048, vocabulary
  51,200, activation recomputation on): does each fit, and what is its 1F1B bubble?
- "How to Scale Your Model" (Austin et al. 2025, part 5, "Training"): below how many tokens
  per chip data parallelism and FSDP turn communication-bound, C / W, on a TPU v5p axis
  (2,550 tokens; 850 over three axes) and on an H100 node.
"""

from __future__ import annotations

from dataclasses import dataclass

from .hardware import CLUSTERS, Cluster
from .plan import plan
from .spec import Layout, ModelSpec

GB = 1e9  # the papers' gigabytes

# -- ZeRO ----------------------------------------------------------------------------------

ZERO_TABLE1_DP = (1, 4, 16, 64, 256, 1024)
ZERO_TABLE1 = {  # stage: GB per device for Ψ = 7.5B at each data-parallel degree above
    0: (120, 120, 120, 120, 120, 120),
    1: (120, 52.5, 35.6, 31.4, 30.4, 30.1),
    2: (120, 41.3, 21.6, 16.6, 15.4, 15.1),
    3: (120, 30, 7.5, 1.88, 0.47, 0.12),
}
ZERO_TABLE2_MP = (1, 2, 4, 8, 16)
ZERO_TABLE2 = {  # stage: largest model (parameters) per model-parallel degree, DP = 64
    0: (2e9, 4e9, 8e9, 16e9, 32e9),
    1: (7.6e9, 15.2e9, 30.4e9, 60.8e9, 121.6e9),
    2: (14.4e9, 28.8e9, 57.6e9, 115.2e9, 230.4e9),
    3: (128e9, 256e9, 512e9, 1e12, 2e12),
}


def zero_model_state_gb(params: float, dp: int, stage: int) -> float:
    """GB of model states per device: the planner on a parameter count, mixed precision."""
    layout = Layout(dp=dp, zero=stage, precision="mixed", global_batch=dp)
    return plan(ModelSpec(params=int(params)), layout).model_state_bytes / GB


def zero_table1(params: float = 7.5e9) -> dict[int, list[float]]:
    return {s: [zero_model_state_gb(params, n, s) for n in ZERO_TABLE1_DP] for s in ZERO_TABLE1}


def largest_model(memory_bytes: float, dp: int, mp: int, stage: int) -> float:
    """Parameters whose model states fit `memory_bytes` per device when `mp`-way model
    parallelism splits them and ZeRO `stage` shards them `dp` ways (states are linear in
    Ψ, so one plan of 1e9 parameters per model-parallel rank gives the bytes per parameter)."""
    per_param = zero_model_state_gb(1e9, dp, stage) * GB / 1e9
    return mp * memory_bytes / per_param


def zero_table2(memory_bytes: float = 32 * GB, dp: int = 64) -> dict[int, list[float]]:
    return {
        s: [largest_model(memory_bytes, dp, mp, s) for mp in ZERO_TABLE2_MP] for s in ZERO_TABLE2
    }


# -- Narayanan et al. 2021, Table 1 ----------------------------------------------------------


@dataclass(frozen=True)
class MegatronRow:
    params_b: float  # the paper's parameter count, billions
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    batch: int
    achieved_tflops: float  # per GPU, as published

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)


NARAYANAN_TABLE1 = (
    MegatronRow(1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    MegatronRow(3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    MegatronRow(7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    MegatronRow(18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    MegatronRow(39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    MegatronRow(76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    MegatronRow(145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    MegatronRow(310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    MegatronRow(529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    MegatronRow(1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
)
SEQ, VOCAB = 2048, 51200


def megatron_plan(row: MegatronRow, cluster: Cluster | None = None, micro_batch: int = 1):
    """The planner's view of one Table 1 layout: mixed-precision Adam without ZeRO (the
    paper's), full recomputation, 1F1B with micro-batches of `micro_batch` sequences."""
    cluster = cluster or CLUSTERS["dgx-a100"]
    model = ModelSpec(row.layers, row.hidden, row.heads, VOCAB, SEQ)
    layout = Layout(
        dp=row.dp,
        tp=row.tp,
        pp=row.pp,
        microbatches=row.batch // (row.dp * micro_batch),
        precision="mixed",
        reduce_in_fp32=False,
        recompute=True,
        global_batch=row.batch,
    )
    return plan(model, layout, cluster)


def model_flops_per_step(row: MegatronRow) -> float:
    """The paper's FLOP count per iteration with recomputation (section 5.1):
    96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))."""
    b, s, ell, h = row.batch, SEQ, row.layers, row.hidden
    return 96 * b * s * ell * h**2 * (1 + s / (6 * h) + VOCAB / (16 * ell * h))


# -- "How to Scale Your Model" -----------------------------------------------------------------


def critical_tokens_per_device(cluster: Cluster, inter_node: bool = False, axes: int = 1) -> float:
    """Tokens per device below which data parallelism (and FSDP) cannot hide its gradient
    traffic behind compute: C / W, the device's FLOP rate over the link bandwidth a ring
    gets (`axes` links used at once multiply it). The planner's step model gives the same
    number: a bf16 all-reduce of Ψ gradients sends ~4Ψ bytes, the backward computes 4Ψ
    FLOPs per token."""
    link = cluster.inter if inter_node else cluster.intra
    return cluster.device.flops / (axes * link.bandwidth_bytes_per_s)


SCALING_BOOK_V5P = {"dp": 2550, "fsdp_3_axes": 850}  # tokens per chip, part 5
