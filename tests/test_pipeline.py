"""Pipeline schedules: their shape and bubble match the theory; the engine equals one process."""

import pytest
import torch.distributed as dist

import minidist
from minidist.data import shard_batch
from minidist.data_parallel.fixture import STEPS, build
from minidist.megatron import ParallelLayout
from minidist.pipeline import PipelineParallel, schedule, simulate, split_gpt, theory
from minidist.training import make_optimizer, max_abs_diff, train

# float32; only the order of summing micro-batch gradients differs from one process
LOSS_TOL, PARAM_TOL = 1e-5, 1e-6
PP_GPT = dict(layers=4)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", [(2, 1), (2, 4), (4, 3), (4, 8), (8, 16)])
def test_bubble_and_memory_of_gpipe_and_1f1b(kind, p, m):
    steps = schedule(kind, p, m)
    timeline = simulate(steps)
    assert timeline.bubble == pytest.approx(theory.bubble_fraction(p, m, kind))
    assert timeline.peak_in_flight() == [theory.peak_microbatches(r, p, m, kind) for r in range(p)]
    for r, stage in enumerate(steps):
        assert sorted(stage) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
        if kind == "1f1b":  # warm-up: min(p-r-1, m) forwards before the first backward
            first_b = stage.index(("B", 0))
            assert first_b == min(p - r - 1, m) + (
                1 if first_b < len(stage) and m > p - r - 1 else 0
            )


@pytest.mark.parametrize("p, m, v", [(4, 8, 2), (2, 4, 2), (4, 4, 3), (4, 4, 2), (3, 6, 2)])
def test_interleaved_divides_the_bubble_by_v(p, m, v):
    steps = schedule("interleaved", p, m, v)
    timeline = simulate(steps)
    assert timeline.bubble == pytest.approx(theory.bubble_fraction(p, m, "interleaved", v))
    assert timeline.bubble < theory.bubble_fraction(p, m, "1f1b")
    peaks = [theory.peak_microbatches(r, p, m, "interleaved", v) for r in range(p)]
    assert timeline.peak_in_flight() == peaks
    for r, stage in enumerate(steps):  # warm-up forwards, then alternate (m = p as well)
        warmup = min((v - 1) * p + 2 * (p - 1 - r), v * m)
        assert [s[0] for s in stage[:warmup]] == ["F"] * warmup
        steady = stage[warmup : warmup + 2 * (v * m - warmup)]
        assert [s[0] for s in steady] == ["F", "B"] * (v * m - warmup)


def test_interleaved_warm_up_is_todays_rule_not_every_forward_first():
    """The issue's example (megatron-core and torch's ScheduleInterleaved1F1B): p = 4,
    m = 4, v = 2 holds at most [8, 8, 7, 5] chunk activations, not 8 on every stage
    (Megatron-LM until core 0.5 ran all forwards first when m = p), with the same bubble."""
    timeline = simulate(schedule("interleaved", 4, 4, 2))
    assert timeline.peak_in_flight() == [8, 8, 7, 5]
    assert timeline.bubble == pytest.approx(theory.bubble_fraction(4, 4, "interleaved", 2))


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (8, 16)])
def test_zero_bubble_h1(p, m):
    zb = simulate(schedule("zb-h1", p, m), forward=1, backward=1, weight=1)
    one = simulate(schedule("1f1b", p, m), forward=1, backward=2)
    assert zb.bubble == pytest.approx(theory.bubble_fraction(p, m, "zb-h1"))
    assert zb.makespan < one.makespan  # (p-1)(F+B-W) instead of (p-1)(F+B+W) idle


def test_no_step_runs_before_its_dependency():
    timeline = simulate(schedule("1f1b", 4, 6), latency=0.5)
    ends = {(s[0], s[1], r): end for r, stage in enumerate(timeline.stages) for s, _, end in stage}
    for r, stage in enumerate(timeline.stages):
        for (op, i), start, _ in stage:
            if op == "F" and r > 0:
                assert start >= ends["F", i, r - 1] + 0.5
            if op == "B" and r < 3:
                assert start >= ends["B", i, r + 1] + 0.5


@pytest.mark.parametrize(
    "args, words",
    [
        (("gpipe", 4, 0), "microbatches=0 must be an int >= 1"),
        (("interleaved", 4, 6, 2), "microbatches=6 a multiple of stages=4"),
        (("pipedream", 2, 2), "kind must be one of"),
    ],
)
def test_bad_schedules_are_named(args, words):
    with pytest.raises(ValueError, match=words):
        schedule(*args)


def test_fewer_layers_than_stages_is_named():
    with pytest.raises(ValueError, match="stages=3 must be between 1 and layers=2"):
        split_gpt(build("gpt").model, 3, 0)


def pipeline_rank(kind: str, m: int, pp: int):
    model, batches, loss_fn = build("gpt", **PP_GPT)
    layout = ParallelLayout(tp=1, pp=pp)
    pipe = PipelineParallel(model, loss_fn, layout, kind, m)
    opt = make_optimizer(pipe.module.parameters())
    losses = []
    with minidist.comm.record() as ledger:
        for batch in batches:
            opt.zero_grad()
            losses.append(pipe.train_step(shard_batch(batch, layout.dp_rank, layout.dp_size)))
            opt.step()
    dp = [r for r in ledger.records if r.tag == "dp-grads"]
    trainable = sum(1 for p in pipe.module.parameters() if p.requires_grad)
    return dict(
        losses=losses,
        params=pipe.full_parameters(),
        peak=pipe.peak_alive,
        peak_bytes=pipe.peak_saved_bytes,
        per_mb=pipe.saved_per_microbatch,
        dp_per_step=len(dp) / STEPS,
        trainable=trainable,
        stage=layout.pp_rank,
    )


@pytest.mark.parametrize("kind", ["gpipe", "1f1b", "zb-h1"])
@pytest.mark.parametrize("p, m", [(2, 1), (2, 2), (4, 4), (4, 8)])  # m divides the batch of 8
def test_pipeline_equals_single_process(kind, p, m):
    model, batches, loss_fn = build("gpt", **PP_GPT)
    ref = train(model, batches, loss_fn, make_optimizer(model.parameters()))
    for r in minidist.launch(pipeline_rank, p, kind, m, p):
        assert r["losses"] == pytest.approx(ref.losses, abs=LOSS_TOL)
        assert max_abs_diff(r["params"], ref.params) < PARAM_TOL  # tied embedding in sync
        # activations alive: m (GPipe), min(p - r, m) (1F1B), until W: min(p, m) (ZB-H1)
        expected = theory.peak_microbatches(r["stage"], p, m, kind)
        assert r["peak"] == expected
        assert r["peak_bytes"] == expected * r["per_mb"]


def test_dp_times_pp_reduces_once_per_step():
    """4 ranks: 2 pipelines of 2 stages; each replica trains on half the batch."""
    model, batches, loss_fn = build("gpt", **PP_GPT)
    ref = train(model, batches, loss_fn, make_optimizer(model.parameters()))
    for r in minidist.launch(pipeline_rank, 4, "1f1b", 2, 2):
        assert max_abs_diff(r["params"], ref.params) < PARAM_TOL
        assert r["dp_per_step"] == r["trainable"]  # one all-reduce per parameter per step


def interleaved_rank(p: int, m: int, v: int, layers: int):
    model, batches, loss_fn = build("gpt", layers=layers)
    layout = ParallelLayout(tp=1, pp=p)
    pipe = PipelineParallel(model, loss_fn, layout, "interleaved", m, virtual=v)
    opt = make_optimizer([q for chunk in pipe.chunks for q in chunk.parameters()])
    losses = []
    for batch in batches:
        opt.zero_grad()
        losses.append(pipe.train_step(batch))
        opt.step()
    blocks = [[str(k) for k in c.held] for c in pipe.chunks]
    return losses, pipe.full_parameters(), blocks, pipe.peak_alive


@pytest.mark.parametrize(
    "p, m, v, layers", [(2, 2, 2, 4), (2, 4, 2, 4), (4, 4, 2, 8), (2, 4, 3, 6)]
)
def test_interleaved_engine_equals_single_process(p, m, v, layers):
    """v model chunks per rank (rank r holds virtual stages r, r + p, ...); activations and
    gradients of different chunks travel between the same ranks under their own tags."""
    model, batches, loss_fn = build("gpt", layers=layers)
    ref = train(model, batches, loss_fn, make_optimizer(model.parameters()))
    for rank, (losses, params, blocks, peak) in enumerate(
        minidist.launch(interleaved_rank, p, p, m, v, layers)
    ):
        assert losses == pytest.approx(ref.losses, abs=LOSS_TOL)
        assert max_abs_diff(params, ref.params) < PARAM_TOL
        assert peak == theory.peak_microbatches(rank, p, m, "interleaved", v)
        per = layers // (p * v)
        assert blocks == [
            [str(k) for k in range((c * p + rank) * per, (c * p + rank + 1) * per)]
            for c in range(v)
        ]


def different_models_rank(case: str):
    layers = 6 if case == "layers" and dist.get_rank() == 1 else 4
    model, _, loss_fn = build("gpt", layers=layers)
    if case == "frozen" and dist.get_rank() == 1:
        model.lm_head.weight.requires_grad_(False)
    try:
        PipelineParallel(model, loss_fn, ParallelLayout(tp=1, pp=2), "1f1b", 2)
    except ValueError as e:
        return str(e)


@pytest.mark.parametrize(
    "case, entry",
    [("layers", "ranks [1]: parameter blocks.4."), ("frozen", "ranks [1]: parameter tok_emb")],
)
def test_ranks_with_different_models_are_refused(case, entry):
    for message in minidist.launch(different_models_rank, 2, case):  # every rank, no hang
        assert message.startswith("PipelineParallel: the model differs between ranks")
        assert entry in message


def test_virtual_chunks_need_the_interleaved_schedule():
    def rank_fn():
        model, _, loss_fn = build("gpt", layers=4)
        PipelineParallel(model, loss_fn, ParallelLayout(tp=1, pp=2), "1f1b", 2, virtual=2)

    with pytest.raises(minidist.RankFailedError, match="virtual=2 needs kind='interleaved'"):
        minidist.launch(rank_fn, 2)


@pytest.mark.parametrize("p", [2, 3, 4, 6])
def test_zb_h1_runs_each_w_r_backward_steps_late_in_arrival_order(p):
    """Stage r runs W_i right after B_(i+r) and its last min(r, m) W steps after its last B,
    in arrival order (Qi et al. 2024, section 2.1; the authors' `WeightGradStore` queue); a
    W holds its micro-batch's activations, so every stage peaks at min(p, m) micro-batches."""
    for m in range(1, 2 * p + 2):
        steps = schedule("zb-h1", p, m)
        timeline = simulate(steps, weight=1)
        for r, stage in enumerate(steps):
            k = theory.postponed_weight_steps(r, p, m)
            last_b = max(j for j, s in enumerate(stage) if s[0] == "B")
            # after the last B: the W it releases (unless k = m), then the k still waiting
            assert stage[last_b + 1 :] == [("W", i) for i in range(max(m - k - 1, 0), m)]
            for i in range(m - k):  # every other W right after the B r steps later
                assert stage.index(("W", i)) == stage.index(("B", i + k)) + 1
            assert sorted(stage) == sorted(
                [(op, i) for op in "FBW" for i in range(m)]
            )  # every step once
        held = timeline.peak_held()
        assert held == [theory.peak_microbatches(r, p, m, "zb-h1") for r in range(p)]
        assert timeline.peak_in_flight() == [min(p - r, m) for r in range(p)]  # F..B: 1F1B's
    assert " ".join(f"{op}{i}" for op, i in schedule("zb-h1", 4, 8)[3][7:12]) == "B3 W0 F4 B4 W1"


def test_zb_h1_is_torchs_interleaved_zero_bubble_with_one_chunk():
    """The order of every rank equals torch's `ScheduleInterleavedZeroBubble` with one local
    stage (its per-rank action list, computed without a process group), for every m torch
    accepts (a multiple of its rounds, max(1, m // p))."""
    from types import SimpleNamespace

    from torch.distributed.pipelining.schedules import (
        ScheduleInterleavedZeroBubble,
        _ComputationType,
    )

    names = {
        _ComputationType.FORWARD: "F",
        _ComputationType.BACKWARD_INPUT: "B",
        _ComputationType.BACKWARD_WEIGHT: "W",
    }
    checked = 0
    for p in range(1, 7):
        for m in range(1, 3 * p + 2):
            rounds = max(1, m // p)
            if m % rounds:
                continue
            this = SimpleNamespace(
                pp_group_size=p,
                _n_microbatches=m,
                n_local_stages=1,
                microbatches_per_round=m // rounds,
            )
            for r, ours in enumerate(schedule("zb-h1", p, m)):
                torch_ops = ScheduleInterleavedZeroBubble._calculate_single_rank_operations(this, r)
                want = [
                    (names[a.computation_type], a.microbatch_index)
                    for a in torch_ops
                    if a is not None
                ]
                assert ours == want
                checked += 1
    assert checked > 100


@pytest.mark.parametrize("p", range(2, 9))
def test_zb_h1_bubble_for_every_m_also_fewer_than_the_stages(p):
    """With m < p the pipeline never fills: the simulator's idle share, F = B = W."""
    for m in range(1, 2 * p + 2):
        timeline = simulate(schedule("zb-h1", p, m), forward=1, backward=1, weight=1)
        assert timeline.bubble == pytest.approx(theory.bubble_fraction(p, m, "zb-h1"))


def test_zb_v_is_torchs_schedule_v_shaped():
    """The order of every rank equals torch's `ScheduleZBVZeroBubble` (its per-rank action
    list, computed without a process group), chunk 0 of rank r being virtual stage r and
    chunk 1 virtual stage 2p-1-r."""
    from types import SimpleNamespace

    from torch.distributed.pipelining.schedules import ScheduleZBVZeroBubble, _ComputationType

    from minidist.pipeline.schedules import virtual_stage

    names = {
        _ComputationType.FORWARD: "F",
        _ComputationType.BACKWARD_INPUT: "B",
        _ComputationType.BACKWARD_WEIGHT: "W",
    }
    for p in range(1, 6):
        for m in range(1, 3 * p + 2):
            ours = schedule("zb-v", p, m)
            for r in range(p):
                torch_ops = ScheduleZBVZeroBubble._calculate_single_rank_operations(
                    SimpleNamespace(pp_group_size=p, _n_microbatches=m, num_stages=2 * p), r
                )
                chunk = {virtual_stage("zb-v", r, c, p): c for c in (0, 1)}
                want = [
                    (names[a.computation_type], a.microbatch_index, chunk[a.stage_index])
                    for a in torch_ops
                    if a is not None
                ]
                assert ours[r] == want


@pytest.mark.parametrize("p", range(2, 7))
def test_zb_v_bubble_and_memory_on_the_simulator(p):
    """F = B = W per chunk: the idle share is the formula's for every m; each rank holds at
    most 2p chunk activations (p micro-batches: 1F1B's first stage), all 2p once m >= 2p."""
    for m in range(1, 3 * p + 1):
        timeline = simulate(schedule("zb-v", p, m), weight=1, placement="v")
        assert timeline.bubble == pytest.approx(theory.bubble_fraction(p, m, "zb-v"))
        held = timeline.peak_held()
        assert max(held) <= 2 * p
        if m >= 2 * p:
            assert held == [2 * p] * p
    # below ZB-H1's idle share (on whole stages: a chunk is half a stage) once the V fills
    assert theory.bubble_fraction(p, 4 * p, "zb-v") < theory.bubble_fraction(p, 4 * p, "zb-h1")


def zb_v_rank(m: int, layers: int):
    model, batches, loss_fn = build("gpt", layers=layers)
    pipe = PipelineParallel(
        model, loss_fn, ParallelLayout(tp=1, pp=dist.get_world_size()), "zb-v", m
    )
    opt = make_optimizer([q for chunk in pipe.chunks for q in chunk.parameters()])
    with minidist.comm.record() as ledger:
        losses = []
        for batch in batches:
            opt.zero_grad()
            losses.append(pipe.train_step(batch))
            opt.step()
    tags = {r.tag for r in ledger.records}
    return losses, pipe.full_parameters(), [[str(k) for k in c.held] for c in pipe.chunks], tags


@pytest.mark.parametrize("p, m, layers", [(2, 1, 4), (2, 4, 4), (4, 8, 8)])
def test_zb_v_engine_equals_single_process(p, m, layers):
    """Run: the V's chunks (rank r: blocks of virtual stages r and 2p-1-r), the hand-off at
    rank p-1 without a message, the tied embedding's two copies both on rank 0."""
    model, batches, loss_fn = build("gpt", layers=layers)
    ref = train(model, batches, loss_fn, make_optimizer(model.parameters()))
    per = layers // (2 * p)
    for rank, (losses, params, blocks, tags) in enumerate(minidist.launch(zb_v_rank, p, m, layers)):
        assert losses == pytest.approx(ref.losses, abs=LOSS_TOL)
        assert max_abs_diff(params, ref.params) < PARAM_TOL
        assert blocks == [
            [str(k) for k in range(vs * per, (vs + 1) * per)] for vs in (rank, 2 * p - 1 - rank)
        ]
        assert "pp-tied-embedding" not in tags  # both copies on rank 0: summed there


@pytest.mark.parametrize(
    "kind, stages, microbatches, virtual",
    [("1f1b", 4, 3, 1), ("interleaved", 2, 4, 2), ("zb-v", 2, 4, 1), ("dualpipev", 2, 4, 1)],
)
def test_an_evaluation_runs_each_forward_once_in_pipeline_order(
    kind, stages, microbatches, virtual
):
    """`forward_only`: every (micro-batch, chunk) once on each stage, micro-batch by
    micro-batch and within one in the order of the chunks' virtual stages, so the whole
    pipeline's forwards run in (micro-batch, virtual stage) order: no backward to wait on."""
    from minidist.pipeline.schedules import forward_only, virtual_stage

    chunks = 2 if kind in ("zb-v", "dualpipev") else virtual
    runs = forward_only(kind, stages, microbatches, virtual)
    assert len(runs) == stages
    for r, steps in enumerate(runs):
        assert [op for op, *_ in steps] == ["F"] * (microbatches * chunks)
        order = [(i, virtual_stage(kind, r, c, stages)) for _, i, c in steps]
        assert order == sorted(order) and len(set(order)) == len(order)
    with pytest.raises(ValueError, match="dualpipev needs microbatches=2"):
        forward_only("dualpipev", 2, 2)


def one_step_grads_rank(kinds: tuple[str, ...], m: int) -> dict:
    """{kind: every stage's gradients after one `train_step`} on a pipeline of the world."""
    grads = {}
    for kind in kinds:
        model, batches, loss_fn = build("gpt", layers=4)
        layout = ParallelLayout(tp=1, pp=dist.get_world_size())
        pipe = PipelineParallel(model, loss_fn, layout, kind, m)
        pipe.train_step(batches[0])
        grads[kind] = pipe.full_grads()
    return grads


def test_split_backward_gives_the_weights_the_gradients_of_one_backward():
    """ZB-H1, ZB-V, DualPipeV: B back-propagates to the stage input only and W from where each
    weight's path joins the input's, fed what B sent there: together the gradients of 1F1B's
    one backward, and of one process (the order of summing micro-batches differs)."""
    model, batches, loss_fn = build("gpt", layers=4)
    x, y = batches[0]
    loss_fn(model(x), y).backward()
    want = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    kinds = ("1f1b", "zb-h1", "zb-v", "dualpipev")
    for got in minidist.launch(one_step_grads_rank, 2, kinds, 4):
        for kind in kinds:
            assert set(got[kind]) == set(want), kind
            assert max_abs_diff(got[kind], want) < 1e-6, kind
            assert max_abs_diff(got[kind], got["1f1b"]) < 1e-6, kind
