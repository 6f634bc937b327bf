"""Llama 3 405B's published layouts planned on lesson 17's rules (Dubey et al. 2024, Table 4)."""

from minidist.compose.published import LLAMA3_405B_TABLE4, plan_llama3, spec


def test_llama3_layouts_are_planned_and_context_parallelism_only_at_128k():
    assert spec(8192).num_params == 412_228_796_416  # 128 equal layers (Meta's 126: 405.85 B)
    rows = plan_llama3()
    assert [row for row, _ in rows] == list(LLAMA3_405B_TABLE4)
    for row, out in rows:
        assert row.tp * row.cp * row.pp * row.dp == row.gpus
        # a first-stage GPU's bf16 parameters: 8 layers over tp 8, the vocabulary shard
        assert 6.5 < out["states_params_gb"] < 7.5
        assert (out["sent_cp_gb"] > 0) == (row.cp > 1)
    (_, a), (_, b), (_, c) = rows
    assert b["states_optimizer_gb"] == a["states_optimizer_gb"] / 2  # ZeRO over twice the dp
    assert c["flops_per_step"] > b["flops_per_step"]  # 16x longer sequences: attention's s²
    # Megatron's 10 collectives a layer of (s/c)·h bf16 over 7/8 of a ring, 8 layers, 32
    # micro-batches; the engine's 19 (a gather per projection) send about twice as much
    assert a["sent_tp_gb"] == 10 * 2 * 8192 * 16384 * 7 / 8 * 8 * 32 / 1e9
    # the engine gathers each shared input once and keeps it (4 + 4 collectives a layer);
    # Megatron re-gathers it in backward to save memory (6 + 4): 8/10, plus the head's
    assert 0.8 < a["engine_tp_gb"] / a["sent_tp_gb"] < 0.85
    # K and V of one KV head (128 wide) over 131,072 tokens, gathered and reduce-scattered;
    # the engine's ring of K and V at the 16 query heads' width sends 16 x 1.5 times more
    assert c["sent_cp_gb"] == 2 * (2 * 2 * 131072 * 128) * 15 / 16 * 8 * 16 / 1e9
    assert 23 < c["engine_cp_gb"] / c["sent_cp_gb"] < 25
    assert a["sent_pp_gb"] == 32 * 1024 * 16384 * 2 / 1e9  # bf16 activations
