"""Real transformers models composed by `parallelize` equal the untouched model in one process.

Each model is built from a tiny config with random weights (`hf_models`), trained 3 Adam
steps at lr 1e-2 on batches where a fifth of the labels are -100, composed on a world and
alone in one process with the model's own loss; the layouts cover dp_shard, dp_replicate,
tp with and without sp (tp = 4 does not divide the 2 KV heads: K/V kept whole), pp (1F1B,
interleaved, ZB-V), cp (ring attention in the model's attention interface) and their
combinations. Tolerances as lesson 17's (tests/test_compose.py): losses 1e-5 (measured
≤ 1e-6), parameters 1e-3 (Adam's 1/√v magnifies summation-order noise where a gradient is
near zero; measured ≤ 1.2e-4), Adam's moments 1e-5 (measured ≤ 4e-7). A wrong loss
normalisation (each micro-batch's own mean over its valid tokens) moves the first loss by
more than 1e-3, a lost sliding window by 2e-2.
"""

import hf_runs
import pytest

import minidist
from minidist.training import max_abs_diff

pytest.importorskip("transformers")

LOSS_TOL, PARAM_TOL, OPTIM_TOL = 1e-5, 1e-3, 1e-5
MHA = {"num_key_value_heads": 4}  # Phi3's fused qkv_proj splits over tp only without GQA
_REFS: dict = {}


def check(name, options, result):
    extra = {k: v for k, v in options.items() if k not in ("micro_batch", "recompute")}
    key = (name, tuple(sorted(extra.items())))
    if key not in _REFS:
        _REFS[key] = hf_runs.reference(name, **extra)
    want = _REFS[key]
    assert result["losses"] == pytest.approx(want["losses"], abs=LOSS_TOL)
    assert set(result["params"]) == set(want["params"])
    assert max_abs_diff(result["params"], want["params"]) < PARAM_TOL
    assert max_abs_diff(result["optim"], want["optim"]) < OPTIM_TOL


def run_and_check(runs, world):
    results = minidist.launch(hf_runs.several, world, runs, timeout_s=900)
    for i, (name, _, options) in enumerate(runs):
        check(name, options, results[0][i])
        for rank in results[1:]:  # every rank reports the same curve
            assert rank[i]["losses"] == results[0][i]["losses"]


RUNS_2 = [
    ("llama", dict(tp=2), {}),
    ("qwen2", dict(tp=2), {}),
    ("mistral", dict(tp=2), {}),
    ("mixtral", dict(tp=2), {}),
    ("gemma", dict(tp=2), {}),
    ("phi3", dict(tp=2), MHA),
    ("gpt2", dict(tp=2), {}),
    ("phi3", dict(dp_shard=2), {}),
    ("mixtral", dict(pp=2, schedule="zb-v"), {}),
]


def test_seven_models_under_tp_2_and_others_equal_one_process():
    run_and_check(RUNS_2, 2)


RUNS_4 = [
    ("llama", dict(tp=2, sp=True, dp_shard=2), {}),
    ("gpt2", dict(tp=2, sp=True, dp_shard=2), {}),
    ("mistral", dict(cp=2, tp=2), {}),
    ("gemma", dict(cp=2, dp_shard=2), {}),
    ("llama", dict(tp=4), {}),
    ("qwen2", dict(tp=4, sp=True), {}),
    ("gemma", dict(pp=2, dp_shard=2), {}),
    ("gpt2", dict(pp=2, tp=2), {}),
    ("mistral", dict(pp=2, schedule="interleaved", virtual=2, dp_replicate=2), {}),
    ("qwen2", dict(pp=2, schedule="zb-v", tp=2, sp=True), {}),
    ("phi3", dict(dp_replicate=2, dp_shard=2), {"micro_batch": 2}),
    ("mixtral", dict(cp=2, pp=2), {}),
]


def test_layouts_of_4_ranks_equal_one_process():
    run_and_check(RUNS_4, 4)


RUNS_8 = [
    ("llama", dict(dp_shard=2, tp=2, sp=True, pp=2), {}),
    ("gpt2", dict(cp=2, tp=2, pp=2, schedule="zb-v"), {}),
    ("mistral", dict(dp_replicate=2, cp=2, tp=2, sp=True), {"recompute": True}),
]


def test_composed_layouts_of_8_ranks_equal_one_process():
    run_and_check(RUNS_8, 8)
