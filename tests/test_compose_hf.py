"""Real transformers models composed by `parallelize` equal the untouched model in one process.

Each model is built from a tiny config with random weights (`hf_models`), trained 3 Adam
steps at lr 1e-2 on batches where a fifth of the labels are -100, composed on a world and
alone in one process with the model's own loss; the layouts cover dp_shard, dp_replicate,
tp with and without sp (tp = 4 does not divide the 2 KV heads: K/V kept whole), pp (1F1B,
interleaved, ZB-H1, ZB-V), cp (ring attention in the model's attention interface), ep (the
model's experts module over ranks, its router kept; DeepSeek-V3's latent attention and
shared expert too; under tp the shared expert split as a dense MLP, the routed experts
whole on each tp rank), recompute (with the zero-bubble schedules too), bf16, and their
combinations.

Tolerances as lesson 17's (tests/test_compose.py): losses 1e-5 (measured ≤ 1e-6),
parameters 1e-3 (Adam's 1/√v magnifies summation-order noise where a gradient is near zero;
measured ≤ 1.2e-4), Adam's moments 1e-5 (measured ≤ 4e-7). bf16 (parameters and compute in
bf16, float32 masters, against the float32 model): losses 1e-2 (measured 2.5e-3),
parameters 6e-2 = 2 · steps · lr (a bf16-rounded gradient can flip the sign of an Adam
update; measured 4.3e-2), moments 1e-2 (bf16 keeps 8 bits, 4e-3 relative; measured
4.7e-3). A wrong loss normalisation (each micro-batch's own mean over its valid tokens)
moves the first loss by far more than 1e-5.
"""

import hf_models
import hf_runs
import pytest
from worlds import HUNG_S

import minidist
from minidist.compose.dims import ParallelDims
from minidist.compose.layout_check import check_layout
from minidist.training import max_abs_diff

pytest.importorskip("transformers")

FP32_TOLS = (1e-5, 1e-3, 1e-5)
BF16_TOLS = (1e-2, 6e-2, 1e-2)
MHA = {"num_key_value_heads": 4}  # Phi3's fused qkv_proj splits over tp only without GQA
_REFS: dict = {}


def check(name, options, result):
    extra = {k: v for k, v in options.items() if k not in ("micro_batch", "recompute", "precision")}
    key = (name, tuple(sorted(extra.items())))
    if key not in _REFS:
        _REFS[key] = hf_runs.reference(name, **extra)
    want = _REFS[key]
    loss_tol, param_tol, optim_tol = BF16_TOLS if "precision" in options else FP32_TOLS
    assert result["losses"] == pytest.approx(want["losses"], abs=loss_tol)
    assert set(result["params"]) == set(want["params"])
    assert max_abs_diff(result["params"], want["params"]) < param_tol
    assert max_abs_diff(result["optim"], want["optim"]) < optim_tol


def run_and_check(runs, world):
    results = minidist.launch(hf_runs.several, world, runs, timeout_s=900, idle_s=HUNG_S)
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
    ("mixtral", dict(dp_shard=2, ep=2), {}),
    ("llama", dict(pp=2, schedule="zb-h1"), {"recompute": True}),
    ("qwen2", dict(pp=2, schedule="zb-v"), {"recompute": True}),
    ("deepseek_v3", dict(dp_shard=2, ep=2), {}),
    ("deepseek_v3", dict(tp=2), {}),  # the shared expert split as a dense MLP
    ("qwen2_moe", dict(tp=2), {}),  # and its gate kept whole
]


def test_seven_models_under_tp_2_and_others_equal_one_process():
    run_and_check(RUNS_2, 2)


RUNS_4 = [
    ("llama", dict(tp=2, sp=True, dp_shard=2), {}),
    ("llama", dict(tp=2, sp=True, dp_shard=2), {"precision": "bf16"}),
    ("gpt2", dict(tp=2, sp=True, dp_shard=2), {}),
    ("mistral", dict(cp=2, tp=2), {}),
    ("gemma", dict(cp=2, dp_shard=2), {}),
    ("llama", dict(tp=4), {"vocab_size": 130}),  # padded to 132: the last rank's 2 rows out
    ("qwen2", dict(tp=4, sp=True), {}),
    ("gemma", dict(pp=2, dp_shard=2), {}),
    ("gpt2", dict(pp=2, tp=2), {}),
    ("mistral", dict(pp=2, schedule="interleaved", virtual=2, dp_replicate=2), {}),
    ("qwen2", dict(pp=2, schedule="zb-v", tp=2, sp=True), {}),
    ("phi3", dict(dp_replicate=2, dp_shard=2), {"micro_batch": 2}),
    ("mixtral", dict(cp=2, pp=2), {}),
    ("mixtral", dict(dp_shard=2, cp=2, ep=4), {}),
    ("mixtral", dict(dp_shard=2, ep=2, tp=2, sp=True), {}),
    ("deepseek_v3", dict(cp=2, pp=2), {}),
    ("deepseek_v3", dict(dp_shard=2, ep=2, tp=2, sp=True), {}),  # routed per block under sp
    ("qwen2_moe", dict(dp_shard=2, ep=2, tp=2, sp=True), {}),
]


def test_layouts_of_4_ranks_equal_one_process():
    run_and_check(RUNS_4, 4)


RUNS_8 = [
    ("llama", dict(dp_shard=2, tp=2, sp=True, pp=2), {}),
    ("gpt2", dict(cp=2, tp=2, pp=2, schedule="zb-v"), {}),
    ("mistral", dict(dp_replicate=2, cp=2, tp=2, sp=True), {"recompute": True}),
    ("mixtral", dict(dp_shard=2, ep=2, pp=2, tp=2), {}),
]


def test_composed_layouts_of_8_ranks_equal_one_process():
    run_and_check(RUNS_8, 8)


REFUSED = [
    ("phi3", dict(tp=2), "fuses Q, K, V with 2 KV heads"),
    ("llama", dict(tp=8), "tp=8 must divide the heads=4"),
    ("llama", dict(pp=5), "need at least one layer each, more than the layers=4"),
    ("llama", dict(ep=2, dp_shard=2), "ep=2 needs a model with experts"),
    ("mixtral", dict(ep=3, dp_shard=3), "ep=3 must divide the experts=4"),
    ("llama", dict(cp=3), "sequence length 16 must divide by 2·cp"),
]


@pytest.mark.parametrize("name,dims,message", REFUSED)
def test_what_cannot_be_composed_is_refused_in_the_parent_naming_the_feature(name, dims, message):
    model = hf_models.build(name, layers=4)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        check_layout(model, ParallelDims(**dims), seq_len=16)


def test_sequence_parallelism_sends_megatrons_bytes_one_gather_per_module_input():
    """Korthikanti et al. 2022 §4.2.2: per layer and micro-batch, 4 all-gathers and 4
    reduce-scatters of s·b·h (the attention's and the MLP's input gathered once each, their
    outputs reduce-scattered, and the reverse in backward); plus the final norm's gather and
    its backward, and the first layer's scatter's backward gather."""
    t, layers = 2, 4
    records = minidist.launch(hf_runs.sequence_parallel_records, t, "llama", t, layers)[0]
    s, b, h = hf_runs.SEQ, hf_runs.BATCH, 32
    one = (t - 1) / t * s * b * h * 4
    assert len(records) == 8 * layers + 3
    assert sum(bytes_ for _, bytes_ in records) == (8 * layers + 3) * one


def test_padded_batches_with_an_attention_mask_equal_one_process():
    """Right padding, masked by the model and labelled -100: pp 2 · tp 2 (sp) on 4 ranks.
    The first loss (no Adam step yet) within 1e-6 (measured 0): a wrong normalisation moves
    it by far more. The later ones within 1e-4: the padded rows leave many gradients near
    zero, where Adam's 1/√v magnifies tp's other summation order (measured 4.8e-7 after one
    step, 2.7e-5 after two, the same at tp 2 alone)."""
    dims = dict(pp=2, tp=2, sp=True)
    got = minidist.launch(hf_runs.padded_composed, 4, "mistral", dims)[0]
    want = hf_runs.padded_reference("mistral")
    assert got[0] == pytest.approx(want[0], abs=1e-6)
    assert got[1:] == pytest.approx(want[1:], abs=1e-4)


ZB_BYTES = [  # llama: (dims but the schedule, recompute)
    (dict(tp=2, sp=True, pp=2), False),
    (dict(cp=2, pp=2), False),
    (dict(tp=2, pp=2), True),
]


def test_zero_bubble_sends_the_tp_and_cp_bytes_of_1f1b():
    """The split backward's W runs no collective and no recomputation: the tp and cp bytes of
    ZB-H1 equal 1F1B's on every rank, ZB-V's over the world (its ranks hold other layers)."""
    schedules = ("1f1b", "zb-h1", "zb-v")
    runs = [("llama", {**d, "schedule": s}, r) for d, r in ZB_BYTES for s in schedules]
    ranks = minidist.launch(hf_runs.step_bytes, 4, runs, timeout_s=900, idle_s=HUNG_S)
    for i in range(0, len(runs), len(schedules)):
        one_f_one_b = [rank[i] for rank in ranks]
        assert [rank[i + 1] for rank in ranks] == one_f_one_b, runs[i + 1]
        world = [sum(rank[i + 2][k] for rank in ranks) for k in (0, 1)]
        assert world == [sum(sent[k] for sent in one_f_one_b) for k in (0, 1)], runs[i + 2]
