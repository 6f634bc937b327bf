"""Lesson 19's tour row: a tiny transformers DeepSeek-V3 trained by the trainer on
dp_shard 2 · ep 2 · pp (the rest of the world), its routing bias updated on the global load
every step, against the same run in one process."""

from __future__ import annotations

from pathlib import Path

from ..registry import TourRow, tour_row
from ..runtime import launch
from ..training import max_abs_diff


def tiny_deepseek_v3(**overrides):
    """The lesson's model (random weights, nothing downloaded): 4 layers of hidden size 32,
    the first dense, then 8 routed experts in 4 groups (nodes), 2 of them per token from at
    most 2 groups, one shared expert; latent attention with d_c = 8, d_h^R = 4. `overrides`
    change any field of the `DeepseekV3Config`."""
    import torch
    import transformers

    torch.manual_seed(0)
    sizes = dict(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=4,
        topk_group=2,
        first_k_dense_replace=1,
        q_lora_rank=16,
        kv_lora_rank=8,
        qk_rope_head_dim=4,
        qk_nope_head_dim=8,
        v_head_dim=8,
        max_position_embeddings=64,
    )
    config = transformers.DeepseekV3Config(**{**sizes, **overrides})
    return transformers.DeepseekV3ForCausalLM(config)


@tour_row("DeepSeek-V3 (dp_shard x ep x pp, bias update)", lesson=19)
def deepseek_row(world_size: int, out_dir: Path) -> TourRow:
    from ..compose.dims import ParallelDims
    from ..trainer.cli import dims_of, parse
    from ..trainer.loop import reference, train_rank

    pp = max(1, world_size // 2)
    args = parse(
        [
            "--model",
            f"{__name__}:tiny_deepseek_v3",
            "--dp-shard",
            "2",
            "--ep",
            "2",
            "--pp",
            str(pp),
            "--steps",
            "3",
            "--global-batch",
            "8",
            "--moe-bias-update-speed",
            "0.01",
        ]
    )
    dims = dims_of(args)
    got = launch(train_rank, ParallelDims(**dims).world_size, args, dims, timeout_s=600)[0]
    ref = reference(args)
    # lesson 17's tolerances: losses to 1e-5; parameters to 1e-3 (Adam's 1/√v magnifies the
    # reduction order where a gradient is near 0)
    loss = max(abs(a - b) for a, b in zip(got["losses"], ref["losses"]))
    params = max_abs_diff(got["params"], ref["params"])
    return TourRow(
        "DeepSeek-V3 (dp_shard x ep x pp, bias update)",
        loss < 1e-5 and params < 1e-3,
        max(loss, params),
        None,
        None,
        None,
        None,
    )
