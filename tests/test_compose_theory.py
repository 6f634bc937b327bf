"""Lesson 17's plan of a composed layout equals its run, to the byte: the model states by kind
(parameters, gradients, ZeRO's float32 master chunk, Adam's moments) and the bytes rank 0
sends per step on each group kind (dp, tp, pp, cp), on layouts hypothesis draws from every
factorisation of 8 ranks (one world runs them all)."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from micro_batches import lean_micro_batch, lean_runs
from worlds import HUNG_S

import minidist
from minidist.compose import theory
from minidist.compose.dims import ParallelDims
from minidist.compose.fixture import build

GLOBAL_BATCH, MICRO_BATCH = 8, 1
HEADS, LAYERS, SEQ = 4, 4, 16  # the fixture's sizes


def _layouts(world: int = 8) -> list[dict]:
    """Every (dp_replicate, dp_shard, cp, tp, pp, sp, schedule) of `world` the fixture runs."""
    out = []
    for r, d, c, t, p in itertools.product(*[(1, 2, 4, 8)] * 5):
        if r * d * c * t * p != world or HEADS % t or GLOBAL_BATCH % (r * d):
            continue
        for sp, kind in itertools.product((False, True), ("1f1b", "interleaved", "zb-v")):
            if (sp and t == 1) or (p == 1 and kind != "1f1b"):
                continue
            dims = dict(dp_replicate=r, dp_shard=d, cp=c, tp=t, sp=sp, pp=p, schedule=kind)
            dims["virtual"] = 2 if kind == "interleaved" else 1
            try:
                ParallelDims(**dims).check_model(HEADS, LAYERS, SEQ)
            except ValueError:
                continue
            out.append(dims)
    return out


LAYOUTS = _layouts()


def _planned(name, dims, precision="fp32", recompute=False, micro_batch=MICRO_BATCH):
    model, _ = build(name)
    d = ParallelDims(**dims)
    m = GLOBAL_BATCH // (d.dp_replicate * d.dp_shard * micro_batch)
    args = (model, d, micro_batch, m, precision)
    return theory.model_state_bytes(model, d, precision), {
        "dp": theory.dp_bytes(model, d, precision),
        "pp": theory.pp_bytes(*args),
        "cp": theory.cp_bytes(*args, recompute),
        "tp": theory.tp_bytes(*args, recompute),
    }


def _check(cases, results):
    for (name, dims, kw), got in zip(cases, results):
        memory, sent = _planned(name, dims, **kw)
        measured = {k: v for k, v in got["memory"].items() if k != "activations"}
        assert measured == memory, (name, dims, kw, measured, memory)
        assert {k: got["bytes"][k] for k in sent} == sent, (name, dims, kw, got["bytes"], sent)


def test_every_factorisation_of_8_is_a_layout():
    assert len(LAYOUTS) >= 20
    assert all(ParallelDims(**d).world_size == 8 for d in LAYOUTS)


@settings(max_examples=1, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(("gpt", "llama")),
            st.sampled_from(LAYOUTS),
            st.sampled_from(("fp32", "bf16")),
            st.booleans(),
        ),
        min_size=3,
        max_size=3,
    )
)
def test_sampled_layouts_are_planned_to_the_byte(draw):
    cases = []
    for name, dims, precision, recompute in draw:
        # micro-batches of one row: a sampled layout draws large micro-batch counts too
        kw = dict(precision=precision, recompute=recompute, micro_batch=MICRO_BATCH)
        cases.append((name, dims, kw))
    _check(cases, minidist.launch(lean_runs, 8, cases, timeout_s=900, idle_s=HUNG_S)[0])


def test_the_hard_cases_are_planned_to_the_byte():
    """K/V replicated over tp = 4 under sp and cp; ZB-V's split backward with tp and cp and
    recomputation (B runs each collective and recomputation once, W none); HSDP in bf16
    with recomputation; the GPT's tied embedding across an interleaved pipeline and on one
    rank in DualPipeV's V; the MoE's experts sharded by ZeRO over their ep_shard group
    (dp_shard · cp / ep = 2 ranks, not dp_shard · cp = 4); the MoE under tp with sp and
    recomputation (its two whole-sequence all-gathers, the first twice)."""
    cases = [
        ("llama", dict(tp=4, cp=2, sp=True), {}),
        ("llama", dict(dp_shard=2, tp=2, sp=True, pp=2, schedule="zb-v"), {}),
        ("gpt", dict(tp=2, sp=True, cp=2, pp=2, schedule="zb-v"), dict(recompute=True)),
        (
            "gpt",
            dict(dp_replicate=2, dp_shard=2, tp=2, sp=True),
            dict(precision="bf16", recompute=True),
        ),
        ("gpt", dict(tp=2, cp=2, pp=2, schedule="interleaved", virtual=2), {}),
        ("gpt", dict(dp_shard=2, tp=2, pp=2, schedule="dualpipev"), {}),
        ("moe", dict(dp_shard=4, ep=2, pp=2), {}),
        ("moe", dict(dp_shard=2, ep=2, tp=2, sp=True, pp=2), dict(recompute=True)),
    ]
    cases = [
        (name, dims, {"micro_batch": lean_micro_batch(dims), **kw}) for name, dims, kw in cases
    ]
    _check(cases, minidist.launch(lean_runs, 8, cases, timeout_s=900, idle_s=HUNG_S)[0])
