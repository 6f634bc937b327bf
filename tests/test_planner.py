"""The planner: its predictions equal the course's measurements exactly, it reproduces the
published tables, and it refuses impossible layouts by name."""

import subprocess
import sys

import pytest
import torch

import minidist
from minidist.data_parallel.fixture import build
from minidist.planner import CLUSTERS, Layout, ModelSpec, best, frontier, layouts, plan, sweep
from minidist.planner import published as pub
from minidist.planner.course import COURSE_LAYOUTS, course_plan

# -- predicted = measured, for every layout the course runs -----------------------------------


@pytest.mark.parametrize("row", list(COURSE_LAYOUTS))
def test_plan_equals_the_tour_rows_measurement(row, run_tour_row):
    """Exact: the tour row's memory (model states, or stage 0's activations for the
    pipeline) and bytes per step (the ledger; the bus for offload) on 4 ranks."""
    measured = run_tour_row(row)
    predicted = course_plan(row, 4)
    assert predicted.memory == measured.memory_per_rank
    if measured.bytes_per_rank is not None:  # the recompute row runs in one process
        assert predicted.bytes == pytest.approx(measured.bytes_per_rank, rel=1e-12)


def test_meta_model_is_the_course_gpt():
    model = build("gpt").model
    spec = ModelSpec.of(model)
    real = [(n, p.shape, p.requires_grad) for n, p in model.named_parameters()]
    meta = [(n, p.shape, p.requires_grad) for n, p in spec.meta_model().named_parameters()]
    assert meta == real
    assert spec.num_params == sum(p.numel() for p in model.parameters())
    assert spec.trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert all(p.device == torch.device("meta") for p in spec.tensors())


def test_params_only_spec_plans_model_states_and_dp_traffic():
    p = plan(ModelSpec(params=1000), Layout(dp=4, zero=0, optimizer="sgd", global_batch=4))
    assert p.memory == {"params": 4000, "grads": 4000, "optimizer": 4000, "activations": 0.0}
    assert p.traffic == {("all_reduce", "dp"): 2 * 3 / 4 * 4000}
    assert not p.activations_planned
    assert "activations_bytes_per_rank=not_planned" in p.lines()


def test_params_only_plan_refuses_to_judge_fit():
    """Without activations a fit is unknown (the 175B model given by its configuration does
    not fit where its parameter count alone would): `fits` refuses, the states alone answer."""
    p = plan(ModelSpec(params=1000), Layout(dp=4, zero=3, global_batch=4))
    with pytest.raises(ValueError, match="plans no activations"):
        p.fits(10**9)
    assert p.fits_model_states(p.model_state_bytes)
    assert not p.fits_model_states(p.model_state_bytes - 1)
    with pytest.raises(ValueError, match="plans no activations"):
        best([p], 10**9)


def test_recompute_keeps_block_inputs_only():
    spec = ModelSpec(layers=8, hidden=64, heads=4, vocab=50, seq=32)
    plain = plan(spec, Layout(global_batch=4)).memory["activations"]
    recomputed = plan(spec, Layout(global_batch=4, recompute=True)).memory["activations"]
    assert recomputed < plain / 3


def _recompute_pair(**layout):
    spec = ModelSpec(layers=6, hidden=64, heads=4, vocab=50, seq=32)
    return [plan(spec, Layout(**layout, recompute=r)) for r in (False, True)], spec


@pytest.mark.parametrize(
    "layout",
    [
        dict(tp=2, global_batch=4),
        dict(tp=4, pp=2, dp=2, zero=1, microbatches=2, global_batch=8, precision="mixed"),
        dict(tp=2, pp=3, microbatches=3, global_batch=6, optimizer="sgd"),
    ],
)
def test_recompute_repeats_the_forward_all_reduces(layout):
    """Full recomputation runs each block's forward again in backward, with its two g
    all-reduces of b·s·h elements: 6 per layer and micro-batch instead of 4. Nothing else
    changes (the embedding, head and loss are not recomputed; pp and dp bytes are equal)."""
    (plain, recomputed), spec = _recompute_pair(**layout)
    lay = recomputed.layout
    b, layers = lay.global_batch // lay.dp, round(spec.layers / lay.pp)  # stage 0
    one = 2 * (lay.tp - 1) / lay.tp * lay.element_bytes * b * spec.seq * spec.hidden
    extra = recomputed.traffic[("all_reduce", "tp")] - plain.traffic[("all_reduce", "tp")]
    assert extra == pytest.approx(2 * layers * one, rel=1e-12)
    for key in plain.traffic:
        if key != ("all_reduce", "tp"):
            assert recomputed.traffic[key] == plain.traffic[key]
    per_layer = (plain.traffic[("all_reduce", "tp")] + extra) / plain.traffic[("all_reduce", "tp")]
    assert 1.4 < per_layer < 1.5  # 6/4 per layer; the embedding's and loss's few are not repeated


def _tp_all_reduce_bytes(recomputed: bool) -> tuple[int, float]:
    """(sequences, all-reduce ring bytes) of one step of lesson 07's `TensorParallelGPT` on
    this rank, every block recomputed (lesson 06's `recompute`) or not."""
    import torch.distributed as dist

    from minidist import comm
    from minidist.megatron.fixture import build_dense
    from minidist.megatron.layout import ParallelLayout
    from minidist.megatron.model import TensorParallelGPT
    from minidist.recompute import recompute

    model, batches, _ = build_dense()
    tp = TensorParallelGPT(model, ParallelLayout(tp=dist.get_world_size()).group("tp"))
    if recomputed:
        for block in tp.module.blocks:
            recompute(block)
    x, y = batches[0]
    with comm.record() as ledger:
        tp.loss(tp(x), y).backward()
    reduces = [r for r in ledger.records if r.op == "all_reduce"]
    return x.shape[0], sum(r.ring_bytes for r in reduces), len(reduces)


def _tp_recompute_rank() -> list[tuple[int, float, int]]:
    return [_tp_all_reduce_bytes(r) for r in (False, True)]


def test_recompute_tp_bytes_and_calls_equal_the_ledger():
    """Exact: TP (t = 2) with and without every block recomputed, the ledger of one step:
    the bytes, and the number of all-reduces the step model charges α for."""
    from minidist.megatron.fixture import TP_GPT
    from minidist.planner.plan import calls_per_step

    spec = ModelSpec.of(build("gpt", **TP_GPT).model)
    measured = minidist.launch(_tp_recompute_rank, 2)[0]
    for recomputed, (batch, sent, calls) in zip((False, True), measured):
        layout = Layout(tp=2, recompute=recomputed, optimizer="sgd", global_batch=batch)
        assert plan(spec, layout).traffic[("all_reduce", "tp")] == sent
        assert calls_per_step(spec, layout)["tp"] == calls
    assert measured[1][2] - measured[0][2] == 2 * spec.layers  # two g's per recomputed block


@pytest.mark.parametrize(
    "layout",
    [
        dict(global_batch=4),
        dict(tp=2, global_batch=4),
        dict(pp=2, dp=2, microbatches=2, global_batch=8),
    ],
)
def test_recompute_adds_one_forward_to_the_flops(layout):
    """Narayanan et al. 2021, section 5.1 (eq. 3): with full recomputation a step costs
    96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) FLOPs: four passes over the layers (forward,
    forward again, backward = 2 forwards), three over the output head. Without it, three
    passes: 72·B·s·l·h²·(1 + s/(6h)) + 6·B·s·h·V. Per rank: 1/(d·t) of the batch's and
    the stage's share of the layers; the head on the last stage (here: on rank 0 when p=1)."""
    (plain, recomputed), spec = _recompute_pair(**layout)
    lay = plain.layout
    B, s, h, V = lay.global_batch // lay.dp, spec.seq, spec.hidden, spec.vocab
    l = spec.layers // lay.pp  # noqa: E741 (the paper's name)
    head = 6 * B * s * h * V if lay.pp == 1 else 0
    assert recomputed.flops == pytest.approx(
        (96 * B * s * l * h**2 * (1 + s / (6 * h)) + head) / lay.tp, rel=1e-12
    )
    assert plain.flops == pytest.approx(
        (72 * B * s * l * h**2 * (1 + s / (6 * h)) + head) / lay.tp, rel=1e-12
    )
    if lay.pp == 1:
        assert recomputed.flops == pytest.approx(
            96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h)) / lay.tp, rel=1e-12
        )


def test_interleaving_shrinks_the_bubble():
    spec = ModelSpec(layers=8, hidden=64, heads=4, vocab=50, seq=32)
    one = plan(spec, Layout(pp=4, microbatches=8, global_batch=8))
    inter = plan(
        spec, Layout(pp=4, microbatches=8, global_batch=8, schedule="interleaved", virtual=2)
    )
    assert one.bubble == pytest.approx(3 / 11)
    assert inter.bubble < one.bubble


# -- published tables ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, p, m",
    [
        ("zb-v", 2, 4),
        ("zb-v", 4, 8),
        ("zb-v", 3, 12),
        ("zb-v", 4, 3),
        ("dualpipev", 2, 4),
        ("dualpipev", 4, 8),
        ("dualpipev", 3, 12),
    ],
)
def test_v_schedules_bubble_equals_the_simulator(kind, p, m):
    """ZB-V's closed form (lesson 09's theory) and DualPipeV's simulated bubble, F = B = W."""
    from minidist.pipeline import simulate
    from minidist.pipeline.schedules import schedule

    spec = ModelSpec(layers=8, hidden=32, heads=4, vocab=30, seq=16)
    layout = Layout(pp=p, microbatches=m, schedule=kind, global_batch=m)
    timeline = simulate(schedule(kind, p, m), 1.0, 1.0, 1.0, placement="v")
    assert plan(spec, layout).bubble == pytest.approx(timeline.bubble, abs=1e-12)


@pytest.mark.parametrize(
    "kwargs, words",
    [(dict(tp=2), ["tp=2", "dense GPT"]), (dict(recompute=True), ["recompute=True"])],
)
def test_v_schedules_refuse_what_the_engine_does_not_run(kwargs, words):
    spec = ModelSpec(layers=8, hidden=32, heads=4, vocab=30, seq=16)
    for kind in ("zb-v", "dualpipev"):
        with pytest.raises(ValueError) as err:
            plan(spec, Layout(pp=2, microbatches=4, schedule=kind, **kwargs))
        for word in [f"schedule={kind!r}", *words]:
            assert word in str(err.value)


def test_zero_table1_reproduced():
    """ZeRO Table 1 (GB, 7.5B, K = 12): the paper prints 3 significant digits (2 decimals
    below 1 GB), hence 0.5% or 0.005 GB."""
    ours = pub.zero_table1()
    for stage, row in pub.ZERO_TABLE1.items():
        assert ours[stage] == pytest.approx(row, rel=0.005, abs=0.005)


def test_zero_table2_reproduced():
    """ZeRO Table 2, theory half: the paper truncates (7.64B is printed 7.6B)."""
    ours = pub.zero_table2()
    for stage, row in pub.ZERO_TABLE2.items():
        assert ours[stage] == pytest.approx(row, rel=0.03)


def test_megatron_table1_parameter_counts_fit_and_bubble():
    for row in pub.NARAYANAN_TABLE1:
        p = pub.megatron_plan(row)
        assert round(p.model.num_params / 1e9, 1) == row.params_b  # printed to 0.1 B
        assert p.fits(80e9), (row, p.memory_per_rank)
        m = row.batch // row.dp
        assert p.bubble == pytest.approx((row.pp - 1) / (m + row.pp - 1))  # idle / total
        # Narayanan et al.'s section 2.2 bubble time fraction, over the ideal time
        assert p.bubble / (1 - p.bubble) == pytest.approx((row.pp - 1) / m)
        # at peak FLOP/s the roofline is an upper bound on the achieved rate
        assert (
            pub.model_flops_per_step(row) / row.gpus / p.time.total_s > row.achieved_tflops * 1e12
        )


def test_scaling_book_thresholds():
    v5p = CLUSTERS["tpu-v5p"]
    assert pub.critical_tokens_per_device(v5p) == pytest.approx(
        pub.SCALING_BOOK_V5P["dp"], rel=0.01
    )
    assert pub.critical_tokens_per_device(v5p, axes=3) == pytest.approx(
        pub.SCALING_BOOK_V5P["fsdp_3_axes"], rel=0.01
    )


def test_step_model_turns_communication_bound_at_the_threshold():
    """Pure DP of a large model on one v5p axis: the planner's own step model flips from
    compute- to communication-bound at C / W tokens per chip (bf16 gradients)."""
    spec = ModelSpec(layers=4, hidden=4096, heads=32, vocab=32000, seq=1024)
    v5p = CLUSTERS["tpu-v5p"]
    threshold = pub.critical_tokens_per_device(v5p)
    bounds = {}
    for tokens in (threshold / 4, threshold * 4):
        seqs = max(1, round(tokens / spec.seq))
        layout = Layout(dp=8, global_batch=8 * seqs, precision="mixed", reduce_in_fp32=False)
        bounds[tokens] = plan(spec, layout, v5p).time.bound
    assert list(bounds.values()) == ["communication", "compute"]


# -- sweeps --------------------------------------------------------------------------------------


def test_sweep_best_and_frontier():
    spec = ModelSpec(layers=8, hidden=256, heads=8, vocab=1000, seq=128)
    plans = sweep(spec, 8, CLUSTERS["dgx-a100"], global_batch=32, microbatches=4)
    assert {(p.layout.dp, p.layout.tp, p.layout.pp) for p in plans} >= {
        (8, 1, 1),
        (1, 8, 1),
        (2, 2, 2),
    }
    assert all(p.layout.world == 8 for p in plans)
    budget = sorted(p.memory_per_rank for p in plans)[len(plans) // 2]
    ranked = best(plans, budget)
    assert ranked and all(p.fits(budget) for p in ranked)
    assert [p.time.total_s for p in ranked] == sorted(p.time.total_s for p in ranked)
    front = frontier(plans)
    for p in plans:  # nothing beats a frontier point on both axes
        for f in front:
            assert not (p.memory_per_rank < f.memory_per_rank and p.time.total_s < f.time.total_s)


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, world, words",
    [
        (dict(dp=2, tp=2), 8, ["dp=2", "tp=2", "8"]),
        (dict(tp=3), 3, ["tp=3", "heads=4"]),
        (dict(pp=9), 9, ["pp=9", "layers=2"]),
        (dict(tp=2, zero=2), 2, ["zero=2", "tp=2"]),
        (dict(cp=2), 4, ["cp=2", "4"]),
        (dict(tp=3, sp=True), 3, ["tp=3", "heads=4"]),
        (dict(cp=16), 16, ["cp=16", "seq=16", "2·cp=32"]),
        (dict(pp=2, schedule="zb-v"), 2, ["zb-v", "layers=2", "2 × pp = 4"]),
    ],
)
def test_bad_layout_is_named(kwargs, world, words):
    spec = ModelSpec(layers=2, hidden=32, heads=4, vocab=30, seq=16)
    with pytest.raises(ValueError) as err:
        plan(spec, Layout(global_batch=8, **kwargs), world=world)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(schedule="1f2b"), ["schedule='1f2b'"]),
        (dict(zero=4), ["zero=4"]),
        (dict(dp=4, zero=3, shard_size=3, global_batch=4), ["shard_size=3", "dp=4"]),
        (dict(offload="cpu"), ["offload='cpu'", "zero=0"]),
        (dict(dp=3, global_batch=8), ["global_batch=8", "dp=3"]),
        (dict(dp=2.0, global_batch=8), ["dp=2.0", "must be an int"]),
        (dict(pp=2, virtual=2), ["virtual=2", "interleaved", "'1f1b'"]),
        (dict(bucket_cap_mb=float("nan")), ["bucket_cap_mb=nan", "finite"]),
        (dict(sp=True), ["sp=True", "tp > 1", "tp=1"]),
        (dict(sp=1, tp=2), ["sp=1", "True or False"]),
        (dict(sp=True, tp=2, pp=2), ["sp=True", "pp=2"]),
        (dict(cp=0), ["cp=0", ">= 1"]),
        (dict(cp=2.0), ["cp=2.0", "must be an int"]),
        (dict(cp=2, tp=2), ["cp=2", "tp=2", "DDP"]),
        (dict(cp=2, dp=2, zero=1), ["cp=2", "zero=1", "DDP"]),
        (dict(pp=2, schedule="dualpipev", microbatches=2), ["dualpipev", "microbatches=2", "4"]),
    ],
)
def test_bad_layout_fields_are_named(kwargs, words):
    with pytest.raises(ValueError) as err:
        Layout(**kwargs)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(params=float("nan")), ["params=nan", "int >= 1"]),
        (dict(params=0), ["params=0", ">= 1"]),
        (dict(layers=2.5, hidden=32, heads=4, vocab=30, seq=16), ["layers=2.5", "int"]),
        (dict(layers=10**12, hidden=32, heads=4, vocab=30, seq=16), ["layers=", "at most 1024"]),
        (dict(layers=2, hidden=10**9, heads=4, vocab=30, seq=16), ["hidden=1000000000", "64-bit"]),
        (dict(layers=2, hidden=32, heads=4, vocab=10**18, seq=16), ["vocab=", "64-bit"]),
    ],
)
def test_bad_model_spec_is_named(kwargs, words):
    """Refused before any meta model is built (the meta device cannot address 2^63 bytes,
    and a block takes about 10 ms to build)."""
    with pytest.raises(ValueError) as err:
        ModelSpec(**kwargs)
    for word in words:
        assert word in str(err.value)


def test_layer_limit_is_the_boundary():
    from minidist.planner.spec import MAX_LAYERS

    ModelSpec(layers=MAX_LAYERS, hidden=32, heads=4, vocab=30, seq=16)  # built only when used
    with pytest.raises(ValueError, match=f"layers={MAX_LAYERS + 1} must be at most"):
        ModelSpec(layers=MAX_LAYERS + 1, hidden=32, heads=4, vocab=30, seq=16)


def test_params_only_spec_refuses_tensor_parallelism():
    with pytest.raises(ValueError, match="tp=2"):
        plan(ModelSpec(params=10**6), Layout(tp=2))
    with pytest.raises(ValueError, match="cp=2"):
        plan(ModelSpec(params=10**6), Layout(cp=2))


def test_sequence_parallelism_refuses_a_sequence_tp_does_not_divide():
    spec = ModelSpec(layers=2, hidden=32, heads=4, vocab=30, seq=18)
    plan(spec, Layout(tp=4))  # plain tp: the sequence stays whole
    plan(ModelSpec(layers=2, hidden=32, heads=4, vocab=30, seq=17), Layout())  # odd: no cp
    with pytest.raises(ValueError, match=r"sp=True needs seq=18 divisible by tp=4"):
        plan(spec, Layout(tp=4, sp=True))


def test_sequence_parallelism_moves_the_same_activation_bytes_and_stores_less():
    """Each all-reduce becomes a reduce-scatter + all-gather (the same ring bytes) and backward
    re-gathers the stored blocks: lesson 14's count is lesson 07's plus one all-gather per
    region in backward, plus the replicated gradients' all-reduce. The blocks' replicated
    parts are stored 1/t."""
    from minidist import comm
    from minidist.planner.activations import layer_bytes

    spec = ModelSpec(layers=3, hidden=64, heads=8, vocab=50, seq=32)
    t, b = 4, 8
    tp, sp = (plan(spec, Layout(tp=t, dp=2, global_batch=2 * b, sp=on)) for on in (False, True))
    regather = 2 * spec.layers * comm.ring_bytes("all_gather", 4 * b * spec.seq * spec.hidden, t)
    assert sp.traffic[("reduce_scatter+all_gather", "tp")] == pytest.approx(
        tp.traffic[("all_reduce", "tp")] + regather, rel=1e-12
    )
    assert sp.traffic[("all_reduce", "dp")] == tp.traffic[("all_reduce", "dp")]
    assert sp.traffic[("all_reduce", "tp")] > 0  # the replicated parameters' gradients
    assert layer_bytes(spec, sp.layout) < layer_bytes(spec, tp.layout)
    assert sp.memory["activations"] < tp.memory["activations"]
    assert sp.model_state_bytes == tp.model_state_bytes


def _tp_saved_bytes(sequence_parallel: bool) -> int:
    from minidist.megatron.fixture import build_dense
    from minidist.megatron.model import TensorParallelGPT
    from minidist.memory import SavedActivations

    model, batches, _ = build_dense()
    tp = TensorParallelGPT(model, None, sequence_parallel=sequence_parallel)
    x, y = batches[0]
    with SavedActivations(tp) as saved:
        tp.loss(tp(x), y)
    return saved.bytes


def _tp_saved_both() -> list[int]:
    return [_tp_saved_bytes(sp) for sp in (False, True)]


def test_tensor_parallel_activations_equal_what_autograd_saves():
    """The whole tensor-parallel GPT at t = 4, with and without sequence parallelism: its
    blocks, the vocab-parallel embedding (shifted ids, mask; 1/t of the positions under sp)
    and the head and vocab-parallel loss (the final norm 1/t under sp), to the byte."""
    from minidist.megatron.fixture import build_dense

    spec = ModelSpec.of(build_dense().model)
    measured = minidist.launch(_tp_saved_both, 4)[0]
    planned = [
        plan(spec, Layout(tp=4, sp=sp, optimizer="sgd")).memory["activations"]
        for sp in (False, True)
    ]
    assert planned == measured
    assert measured[1] < measured[0]


def _cp_saved_bytes() -> int:
    from minidist.context_parallel.model import ContextParallelGPT
    from minidist.megatron.fixture import build_dense
    from minidist.memory import SavedActivations

    model, batches, _ = build_dense()
    cp = ContextParallelGPT(model, None, "zigzag")
    x, y = batches[0]
    with SavedActivations(cp) as saved:
        cp.loss(cp(x), y)
    return saved.bytes


def test_context_parallel_activations_equal_what_autograd_saves():
    """The whole context-parallel GPT at c = 4 (zig-zag): 1/c of every activation of the
    dense GPT, but the loss's mean scalar, to the byte."""
    from minidist.megatron.fixture import build_dense

    spec = ModelSpec.of(build_dense().model)
    measured = minidist.launch(_cp_saved_bytes, 4)[0]
    assert plan(spec, Layout(cp=4, optimizer="sgd")).memory["activations"] == measured


def test_context_parallelism_composes_with_ddp():
    """cp × dp: the gradients are all-reduced over the d·c ranks that hold the whole model,
    the same all-reduce as DDP's over as many ranks; the ring over c, with each replica's
    sequences; every activation and FLOP over c."""
    spec = ModelSpec(layers=2, hidden=32, heads=4, vocab=30, seq=16)
    both = plan(spec, Layout(dp=2, cp=2, global_batch=8), CLUSTERS["dgx-h100"])
    ddp = plan(spec, Layout(dp=4, global_batch=8))
    alone = plan(spec, Layout(cp=2, global_batch=4))  # one replica's 4 sequences
    assert both.layout.world == 4
    assert both.traffic[("all_reduce", "dp-cp")] == ddp.traffic[("all_reduce", "dp")]
    assert both.traffic[("p2p", "cp")] == alone.traffic[("p2p", "cp")] > 0
    dense = plan(spec, Layout(global_batch=4))
    assert alone.memory["activations"] < dense.memory["activations"] / 2 + 4
    assert alone.flops == pytest.approx(dense.flops / 2)
    assert alone.model_state_bytes == dense.model_state_bytes
    assert both.time.cp_s > 0 and both.by_link["intra-node"] == both.bytes_sent


def test_layouts_with_fixed_sp_or_cp():
    spec = ModelSpec(layers=2, hidden=32, heads=4, vocab=30, seq=16)
    sp = layouts(spec, 8, global_batch=8, sp=True)
    assert sp and all(lay.tp > 1 and lay.sp and lay.world == 8 for lay in sp)
    cp = layouts(spec, 8, global_batch=8, cp=4)
    assert [(lay.dp, lay.cp, lay.world) for lay in cp] == [(2, 4, 8)]
    assert layouts(spec, 8, global_batch=8, cp=3) == []


def test_layouts_skip_what_cannot_run():
    spec = ModelSpec(layers=2, hidden=32, heads=2, vocab=30, seq=16)
    assert all(lay.tp in (1, 2) and lay.pp <= 2 for lay in layouts(spec, 8, global_batch=8))


# -- the command (its options and output: tests/test_planner_cli.py) ---------------------------


def test_bench_plan_prints_name_value_lines():
    """Runs the fit and both timed layouts; prints ratios (never asserted: timing)."""
    out = subprocess.run(
        [sys.executable, "-m", "minidist", "bench", "plan", "--rounds", "1", "--steps", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    values = dict(line.split("=") for line in out.stdout.split())
    for kind in ("dp", "tp"):
        assert float(values[f"{kind}_measured_over_predicted"]) > 0


def test_params_only_fsdp_sends_three_halves_of_ddp():
    spec = ModelSpec(params=4000)
    ddp = plan(spec, Layout(dp=4, global_batch=4)).bytes_sent
    fsdp = plan(spec, Layout(dp=4, zero=3, global_batch=4)).bytes_sent
    assert fsdp == pytest.approx(1.5 * ddp)


def test_bytes_by_link_class_puts_tp_inside_the_node_and_dp_across():
    """Megatron's order on 8-GPU nodes: t = 8 fills a node, so dp's groups span nodes."""
    spec = ModelSpec(layers=4, hidden=256, heads=8, vocab=1000, seq=128)
    p = plan(spec, Layout(dp=4, tp=8, global_batch=16), CLUSTERS["dgx-h100"])
    assert p.by_link["intra-node"] == pytest.approx(p.traffic[("all_reduce", "tp")])
    assert p.by_link["inter-node"] == pytest.approx(p.traffic[("all_reduce", "dp")])
    small = plan(spec, Layout(dp=4, tp=2, global_batch=16), CLUSTERS["dgx-h100"])
    assert small.by_link["inter-node"] == 0  # t·d = 8 ranks: one node
    assert "bytes_sent[inter-node]=" in "\n".join(p.lines())


def _pipeline_peak(kind: str, p: int, m: int, v: int, layers: int) -> tuple:
    """(peak saved bytes, parameters, trainable ones, p2p bytes sent) of this rank, one step."""
    from minidist.megatron.layout import ParallelLayout
    from minidist.pipeline.engine import PipelineParallel
    from minidist.pipeline.fixture import build_pp

    model, batches, loss_fn = build_pp(layers=layers)
    pipe = PipelineParallel(model, loss_fn, ParallelLayout(tp=1, pp=p), kind, m, virtual=v)
    with minidist.comm.record() as ledger:
        pipe.train_step(batches[0])
    sent = sum(r.ring_bytes for r in ledger.records if r.tag in ("pp", "pp-tied-embedding"))
    params = list(pipe.module.parameters())
    trainable = sum(q.numel() for q in params if q.requires_grad)
    return pipe.peak_saved_bytes, sum(q.numel() for q in params), trainable, sent


@pytest.mark.parametrize(
    "kind, p, m, v, layers",
    [
        ("gpipe", 2, 4, 1, 4),
        ("zb-h1", 4, 8, 1, 4),
        ("interleaved", 2, 4, 2, 4),
        ("interleaved", 4, 8, 2, 8),
        ("interleaved", 2, 4, 2, 5),
        ("zb-v", 2, 4, 1, 4),
        ("zb-v", 2, 2, 1, 4),
        ("dualpipev", 2, 4, 1, 4),
        ("dualpipev", 3, 8, 1, 6),
    ],
)
def test_stage0_activations_equal_the_engine_for_every_schedule(kind, p, m, v, layers):
    """Exact: the walk of rank 0's schedule (chunks of 1/v of its layers, the embedding's
    indices on the first chunk; in a V the head's and the loss's on the second) against the
    bytes the engine's saved-tensor hooks count; and rank 0's parameters (every chunk's; in
    a V the tied copy twice) and the bytes it sends on the pipeline (every chunk's)."""
    from minidist.pipeline.fixture import build_pp

    peak, params, trainable, sent = minidist.launch(_pipeline_peak, p, kind, p, m, v, layers)[0]
    spec = ModelSpec.of(build_pp(layers=layers).model)
    layout = Layout(pp=p, microbatches=m, schedule=kind, virtual=v, optimizer="sgd")
    planned = plan(spec, layout)
    assert planned.memory["activations"] == peak
    assert (planned.memory["params"], planned.memory["grads"]) == (4 * params, 4 * trainable)
    assert planned.traffic[("p2p", "pp")] == sent


def test_one_process_activations_equal_what_autograd_saves():
    """Blocks, the embedding's indices and the head's and loss's tensors, to the byte."""
    from minidist.memory import SavedActivations

    model, batches, loss_fn = build("gpt")
    x, y = batches[0]
    with SavedActivations(model) as saved:
        loss_fn(model(x), y)
    layout = Layout(global_batch=x.shape[0])
    assert plan(ModelSpec.of(model), layout).memory["activations"] == saved.bytes


def test_divisors_equal_counting_and_factor_large_worlds():
    """The sweep's divisors from prime factors (Miller-Rabin, Pollard's rho) equal counting
    1..n, and a world of 10^20 or two 10^9-sized primes factors without counting."""
    from minidist.planner.divisors import divisors, prime_factors

    for n in range(1, 600):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]
    assert len(divisors(10**20)) == 21 * 21
    assert prime_factors(1000000007 * 998244353) == {998244353: 1, 1000000007: 1}
    assert prime_factors(2**61 - 1) == {2**61 - 1: 1}
    with pytest.raises(ValueError, match="n=0"):
        divisors(0)


@pytest.mark.parametrize("tp", [1, 2])
def test_recomputation_adds_one_forward_of_every_layer_to_the_flops(tp):
    """Chen et al. 2016: recomputing each block runs its forward twice, so a step costs
    4/3 of the 3x-forward count for the blocks; the head is not recomputed."""
    from minidist.megatron import theory as tp_theory

    spec = ModelSpec.of(build("gpt", heads=4).model)
    plain = plan(spec, Layout(tp=tp, global_batch=8)).flops
    recomputed = plan(spec, Layout(tp=tp, global_batch=8, recompute=True)).flops
    forward = tp_theory.transformer_layer_flops(8, spec.seq, spec.hidden) / 3
    assert recomputed - plain == pytest.approx(spec.layers * forward / tp)


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 4)])
def test_interleaving_adds_p_minus_1_chunk_sized_micro_batches(p, m):
    """Narayanan et al. 2021, section 2.2: with v chunks the first stage holds p micro-batches
    plus (p-1) warm-up chunks of 1/v of its layers: p·(1 + (p-1)/(p·v)) stages' worth."""
    from minidist.planner.activations import in_flight_microbatches

    for v in (1, 2, 3):
        layout = Layout(pp=p, microbatches=m, schedule="interleaved", virtual=v)
        assert in_flight_microbatches(layout) == pytest.approx(p + (p - 1) / v)
