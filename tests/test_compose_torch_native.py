"""Torch's own composition (FSDP2 × DTensor TP/SP × pipelining), the other side of `bench
compose`, trains the Llama-style model as one process does, on gloo and CPUs."""

import types

import hf_models
import hf_runs
import pytest
import torch
from worlds import HUNG_S

import minidist
from minidist.compose import torch_native
from minidist.models import lm_loss
from minidist.models_llama import LlamaConfig, LlamaForCausalLM

CFG = LlamaConfig(vocab_size=64, seq_len=16, layers=4, heads=4, kv_heads=2, hidden=32, ffn=64)
STEPS, BATCH, MICRO = 2, 8, 2


def _dims(dp_replicate=1, dp_shard=1, tp=1, sp=False, pp=1, schedule="1f1b", virtual=1):
    return types.SimpleNamespace(
        dp_replicate=dp_replicate,
        dp_shard=dp_shard,
        tp=tp,
        sp=sp,
        pp=pp,
        schedule=schedule,
        virtual=virtual,
        cp=1,
        ep=1,
    )


def _batches():
    g = torch.Generator().manual_seed(1)
    return [
        tuple(torch.randint(0, 64, (BATCH, 16), generator=g) for _ in range(2))
        for _ in range(STEPS)
    ]


def _model():
    torch.manual_seed(0)
    return LlamaForCausalLM(CFG)


def _rank(dims):
    return torch_native.train_on_rank(_model(), dims, _batches(), MICRO)


def _reference():
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x, y in _batches():
        loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    return losses, {n: p.detach() for n, p in model.named_parameters()}


@pytest.mark.parametrize(
    "dims",
    [
        _dims(dp_replicate=2, dp_shard=2, tp=2, sp=True),
        _dims(dp_shard=2, tp=2, sp=True, pp=2, schedule="zb-v"),
    ],
    ids=["hsdp2x2.tp2sp", "fsdp2.tp2sp.pp2-zbv"],  # 1F1B's one chunk per rank: the bench
)
def test_torch_composition_equals_one_process(dims):
    """float32: the same arithmetic in another reduction order (FSDP2 reduce-scatters,
    DTensor's all-reduces, micro-batch means). Losses within 1e-5; parameters within 5e-4
    after two AdamW steps of lr 1e-2: Adam moves an element by lr·m/(√v + ε), so where a
    gradient is near ε = 1e-8 a rounding-size change in it moves the element by a good part
    of lr (the largest seen: 7e-5, always in elements whose gradient is below 1e-6)."""
    world = dims.dp_replicate * dims.dp_shard * dims.tp * dims.pp
    _check(
        minidist.launch(_rank, world, dims, timeout_s=300, idle_s=HUNG_S),
        world // dims.pp,
        *_reference(),
    )


def _check(results, last_ranks, ref_losses, ref_params):
    replicas = [r[0] for r in results if r[0] is not None]  # every tp rank of a last stage
    assert len(replicas) == last_ranks
    losses = [sum(r[i] for r in replicas) / len(replicas) for i in range(STEPS)]
    assert max(abs(a - b) for a, b in zip(losses, ref_losses)) < 1e-5, (losses, ref_losses)
    seen = set()
    for _, full in results:
        for name, p in full.items():
            assert (p - ref_params[name]).abs().max() < 5e-4, name
            seen.add(name)
    assert seen == set(ref_params)


def test_context_parallelism_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="context parallelism"):
        torch_native.build(_model(), types.SimpleNamespace(cp=2, ep=1), lm_loss, 2, None, 16)


def _hf_rank(name, dims):
    batches = [
        (ids, hf_runs.shifted(labels)) for ids, labels in hf_models.batches(STEPS, BATCH, 16)
    ]
    return torch_native.train_on_rank(hf_models.build(name), dims, batches, MICRO)


def _hf_reference(name):
    model = hf_models.build(name)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for ids, labels in hf_models.batches(STEPS, BATCH, 16):
        loss = model(input_ids=ids, labels=labels).loss  # the untouched model's own loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    return losses, {n: p.detach() for n, p in model.named_parameters()}


HF_LAYOUTS = [
    ("llama", _dims(dp_shard=2, tp=2, sp=True)),
    ("mistral", _dims(tp=2, sp=True, pp=2, schedule="zb-v")),
    ("qwen2", _dims(dp_replicate=2, pp=2)),
    ("gemma", _dims(dp_shard=2, dp_replicate=2)),
]


@pytest.mark.parametrize("name,dims", HF_LAYOUTS, ids=[n for n, _ in HF_LAYOUTS])
def test_torch_composition_runs_the_transformers_models_own_forward(name, dims):
    """The same stages (`compose.split`) under torch's FSDP2 × DTensor × pipelining, on real
    transformers models with -100 labels, equal the untouched model (tolerances above)."""
    pytest.importorskip("transformers")
    world = dims.dp_replicate * dims.dp_shard * dims.tp * dims.pp
    results = minidist.launch(_hf_rank, world, name, dims, timeout_s=300, idle_s=HUNG_S)
    _check(results, world // dims.pp, *_hf_reference(name))


def test_a_tied_head_under_tp_is_refused_by_torchs_composition():
    pytest.importorskip("transformers")
    with pytest.raises(ValueError, match="tied head"):
        torch_native.build(hf_models.build("gemma"), _dims(tp=2), None, 2, None, 16)
