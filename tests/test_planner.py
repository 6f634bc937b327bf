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


def test_recompute_keeps_block_inputs_only():
    spec = ModelSpec(layers=8, hidden=64, heads=4, vocab=50, seq=32)
    plain = plan(spec, Layout(global_batch=4)).memory["activations"]
    recomputed = plan(spec, Layout(global_batch=4, recompute=True)).memory["activations"]
    assert recomputed < plain / 3


def test_interleaving_shrinks_the_bubble():
    spec = ModelSpec(layers=8, hidden=64, heads=4, vocab=50, seq=32)
    one = plan(spec, Layout(pp=4, microbatches=8, global_batch=8))
    inter = plan(
        spec, Layout(pp=4, microbatches=8, global_batch=8, schedule="interleaved", virtual=2)
    )
    assert one.bubble == pytest.approx(3 / 11)
    assert inter.bubble < one.bubble


# -- published tables ---------------------------------------------------------------------------


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
        assert p.bubble == pytest.approx((row.pp - 1) / (m + row.pp - 1))
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
    ],
)
def test_bad_layout_fields_are_named(kwargs, words):
    with pytest.raises(ValueError) as err:
        Layout(**kwargs)
    for word in words:
        assert word in str(err.value)


def test_params_only_spec_refuses_tensor_parallelism():
    with pytest.raises(ValueError, match="tp=2"):
        plan(ModelSpec(params=10**6), Layout(tp=2))


def test_layouts_skip_what_cannot_run():
    spec = ModelSpec(layers=2, hidden=32, heads=2, vocab=30, seq=16)
    assert all(lay.tp in (1, 2) and lay.pp <= 2 for lay in layouts(spec, 8, global_batch=8))


# -- the command ---------------------------------------------------------------------------------


def _plan_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "minidist", "plan", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_params_only_prints_model_states():
    out = _plan_cli("--params", "7.5e9", "--world", "64", "--zero", "1")
    assert out.returncode == 0, out.stderr
    values = dict(line.split("=", 1) for line in out.stdout.split())
    assert int(values["model_state_bytes_per_rank"]) == pytest.approx(31.4e9, rel=0.002)


def test_cli_with_a_config_prints_every_number_and_the_best_layouts():
    out = _plan_cli(
        "--layers", "4", "--hidden", "256", "--heads", "8", "--vocab", "1000", "--seq", "128",
        "--world", "8", "--tp", "2", "--pp", "2", "--microbatches", "4",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    for name in ("activations_bytes_per_rank=", "bytes_sent_per_rank_per_step=", "bubble=",
                 "step_time_s=", "memory_bytes_per_rank=", "fits=yes", "# best of",
                 "layout=dp"):  # fmt: skip
        assert name in out.stdout


def test_cli_notes_a_pipeline_without_micro_batches():
    out = _plan_cli(
        "--layers", "4", "--hidden", "256", "--heads", "8", "--vocab", "1000", "--seq", "128",
        "--world", "4", "--pp", "4", "--microbatches", "1",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "bubble=0.7500" in out.stdout and "pp=4 with 1 micro-batch" in out.stderr


def test_cli_bad_degrees_are_named():
    out = _plan_cli("--params", "1e9", "--world", "6", "--tp", "4")
    assert out.returncode != 0
    assert "--world 6" in out.stderr and "--tp 4" in out.stderr


def test_bench_plan_prints_name_value_lines():
    """Runs the fit and both timed layouts; prints ratios (never asserted: timing)."""
    out = subprocess.run(
        [sys.executable, "-m", "minidist", "bench", "plan", "--rounds", "1", "--steps", "1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
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


def test_cli_micro_batch_sets_the_micro_batches_of_every_layout():
    out = _plan_cli(
        "--layers", "4", "--hidden", "256", "--heads", "8", "--vocab", "1000", "--seq", "128",
        "--world", "8", "--pp", "4", "--micro-batch", "1", "--global-batch", "32",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    values = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line[:40])
    assert float(values["bubble"]) == pytest.approx(3 / (16 + 3), abs=1e-4)  # dp 2: m = 16


def _pipeline_peak(kind: str, p: int, m: int, v: int, layers: int) -> int:
    from minidist.megatron.layout import ParallelLayout
    from minidist.pipeline.engine import PipelineParallel
    from minidist.pipeline.fixture import build_pp

    model, batches, loss_fn = build_pp(layers=layers)
    pipe = PipelineParallel(model, loss_fn, ParallelLayout(tp=1, pp=p), kind, m, virtual=v)
    pipe.train_step(batches[0])
    return pipe.peak_saved_bytes


@pytest.mark.parametrize(
    "kind, p, m, v, layers",
    [("gpipe", 2, 4, 1, 4), ("zb-h1", 4, 8, 1, 4), ("interleaved", 2, 4, 2, 4),
     ("interleaved", 4, 8, 2, 8)],
)  # fmt: skip
def test_stage0_activations_equal_the_engine_for_every_schedule(kind, p, m, v, layers):
    """Exact: the walk of rank 0's schedule (chunks of 1/v of its layers, the embedding's
    indices on the first chunk) against the bytes the engine's saved-tensor hooks count."""
    from minidist.pipeline.fixture import build_pp

    measured = minidist.launch(_pipeline_peak, p, kind, p, m, v, layers)[0]
    spec = ModelSpec.of(build_pp(layers=layers).model)
    layout = Layout(pp=p, microbatches=m, schedule=kind, virtual=v, optimizer="sgd")
    assert plan(spec, layout).memory["activations"] == measured


def test_one_process_activations_equal_what_autograd_saves():
    """Blocks, the embedding's indices and the head's and loss's tensors, to the byte."""
    from minidist.memory import SavedActivations

    model, batches, loss_fn = build("gpt")
    x, y = batches[0]
    with SavedActivations(model) as saved:
        loss_fn(model(x), y)
    layout = Layout(global_batch=x.shape[0])
    assert plan(ModelSpec.of(model), layout).memory["activations"] == saved.bytes


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
