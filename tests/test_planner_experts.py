"""The planner's expert parallelism (lesson 16's MoE GPT, `Layout(ep=e)`): the row planned =
measured is in test_planner.py; here the terms against lesson 16's theory, what a plan says
it cannot plan, and each bad spec or layout refused by name."""

import pytest

import minidist
from minidist.expert_parallel import theory as ep_theory
from minidist.expert_parallel.fixture import build_gpt
from minidist.expert_parallel.gpt import is_expert
from minidist.planner import CLUSTERS, Layout, ModelSpec, layouts, plan
from minidist.planner.plan import calls_per_step

MOE = ModelSpec(
    layers=4, hidden=64, heads=4, vocab=128, seq=32, experts=8, top_k=2, capacity_factor=1.25
)


def test_meta_model_is_lesson_16s_moe_gpt():
    model = build_gpt(2, steps=0)[0]
    spec = ModelSpec.of(model)
    assert (spec.experts, spec.top_k, spec.capacity_factor) == (4, 2, 1.0)
    meta = dict(spec.meta_model().named_parameters())
    assert [(n, p.shape) for n, p in model.named_parameters()] == [
        (n, p.shape) for n, p in meta.items()
    ]
    assert spec.expert_numel() == sum(p.numel() for n, p in meta.items() if is_expert(n))


@pytest.mark.parametrize("ep", [1, 2, 4, 8])
def test_bytes_and_states_are_lesson_16s_theory(ep):
    """Every byte from `padded_bytes_sent_per_step` (no routing needed); the states shrink by
    the experts only; the compute is the same E experts on E·C padded rows at every ep."""
    layout = Layout(dp=8, ep=ep, optimizer="sgd", precision="fp32", global_batch=16)
    p = plan(MOE, layout)
    tokens = 16 // 8 * MOE.seq
    cap = ep_theory.capacity(tokens, 8, 2, 1.25)
    experts = MOE.expert_numel()
    want = ep_theory.padded_bytes_sent_per_step(
        MOE.layers, 8, ep, cap, MOE.hidden, MOE.trainable - experts, experts // ep, 8, 8 // ep
    )
    assert p.bytes_sent == pytest.approx(want, rel=1e-12)
    assert (("all_to_all", "ep") in p.traffic) == (ep > 1)
    assert p.model_state_bytes == ep_theory.model_state_bytes_per_rank(
        MOE.num_params - experts, experts, ep
    )
    assert p.flops == plan(MOE, Layout(dp=8, optimizer="sgd", global_batch=16)).flops
    calls = calls_per_step(MOE, layout)
    assert calls["ep"] == (4 * MOE.layers if ep > 1 else 0)
    assert calls["dp"] == 1 + (8 // ep > 1)


def test_all_to_alls_sit_on_the_critical_path_inside_a_node():
    p = plan(MOE, Layout(dp=16, ep=8, global_batch=32), CLUSTERS["dgx-h100"])
    assert p.time.ep_s > 0
    assert p.by_link["intra-node"] >= p.traffic[("all_to_all", "ep")]
    assert "activations_bound=upper" in p.lines() and p.activations_bound
    assert p.fits(p.memory_per_rank) and not p.fits(p.memory_per_rank - 1)
    assert all(lay.tp == lay.pp == 1 and lay.zero == 0 for lay in layouts(MOE, 16, ep=4))
    assert [lay.ep for lay in layouts(MOE, 16, global_batch=32)] == [1, 2, 4, 8]
    assert [lay.ep for lay in layouts(MOE, 12, global_batch=24)] == [1, 2, 4]


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(experts=-1), "experts=-1 must be an int >= 0"),
        (dict(experts=4, top_k=5), "top_k=5 must be an int in 1..experts=4"),
        (dict(experts=4, capacity_factor=0.0), "capacity_factor=0.0 must be a finite number"),
        (dict(experts=4, capacity_factor=float("inf")), "must be a finite number > 0"),
    ],
)
def test_bad_expert_spec_is_named(kwargs, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(".", r"\.")):
        ModelSpec(layers=2, hidden=32, heads=2, vocab=32, seq=16, **kwargs)


def test_experts_need_a_configuration():
    with pytest.raises(ValueError, match="experts=4 needs a GPT configuration"):
        ModelSpec(params=10**6, experts=4)


@pytest.mark.parametrize(
    "kwargs, model, words",
    [
        (dict(dp=6, ep=4, global_batch=6), MOE, "ep=4 must divide dp=6"),
        (dict(dp=4, ep=2, tp=2), MOE, "ep=2 with tp=2: lesson 16 runs experts"),
        (dict(dp=4, ep=2, zero=1), MOE, "ep=2 with zero=1"),
        (dict(dp=4, tp=2), MOE, "a model with experts=8 with tp=2"),
        (dict(dp=4, ep=2, recompute=True), MOE, "ep=2 with recompute=True"),
        (dict(dp=6, ep=3, global_batch=6), MOE, "ep=3 must divide experts=8"),
        (
            dict(dp=4, ep=2),
            ModelSpec(layers=2, hidden=32, heads=2, vocab=32, seq=16),
            "ep=2 needs a model with experts",
        ),
    ],
)
def test_bad_expert_layout_is_named(kwargs, model, words):
    with pytest.raises(ValueError, match=words):
        Layout(**kwargs).check(model)


def _moe_saved(e: int) -> tuple[int, list[int]]:
    """On a rank: what the MoE GPT (padded, experts over e ranks) saves for backward in its
    loss's forward, and how many assignments each layer kept."""
    import torch.distributed as dist

    from minidist.data import shard_batch
    from minidist.expert_parallel.fixture import ALPHA, groups_for
    from minidist.expert_parallel.gpt import ExpertParallelGPT
    from minidist.memory import SavedActivations
    from minidist.models import lm_loss

    model, batches = build_gpt(dist.get_world_size())
    ep = ExpertParallelGPT(model, *groups_for(e))
    x, y = shard_batch(batches[0], dist.get_rank(), dist.get_world_size())
    x, y = x.clone(), y.clone()  # a rank's own ids, not views of the global batch's storage
    with SavedActivations(ep) as saved:
        lm_loss(ep(x), y) + ALPHA * ep.aux_loss()
    kept = [int(b.mlp.moe.routing.kept.sum()) for b in ep.module.blocks]
    return saved.bytes, kept


@pytest.mark.parametrize("n, e", [(2, 2), (4, 2), (4, 4)])
def test_moe_activations_are_exact_for_the_routing_and_bounded_for_any(n, e):
    """The MoE GPT's activations, to the byte, once each layer's kept assignments are known
    (`experts.layer_bytes(kept=K)`); the plan, which counts every slot filled, bounds them."""
    from minidist.expert_parallel.fixture import GPT_BATCH
    from minidist.planner import experts

    spec = ModelSpec.of(build_gpt(n, steps=0)[0])
    layout = Layout(dp=n, ep=e, optimizer="sgd", global_batch=GPT_BATCH)
    planned = plan(spec, layout).memory["activations"]
    full = experts.layer_bytes(spec, layout)
    for measured, kept in minidist.launch(_moe_saved, n, e):
        assert max(kept) <= experts.max_kept(spec, layout)
        exact = planned - sum(full - experts.layer_bytes(spec, layout, k) for k in kept)
        assert measured == exact, (measured, exact, kept)
        assert measured <= planned
