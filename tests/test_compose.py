"""Lesson 17: every parallelism at once equals one process (losses, parameters, Adam state).

Tolerances (float32, Adam at lr 1e-2, 3 steps): the layouts sum gradients in other orders
than one process (tensor-parallel all-reduces, micro-batch accumulation, ring attention's
online softmax, the reduce-scatter), a few ulps per step. Losses stay within 1e-5 (measured
≤ 5e-7). Parameters within 1e-3: Adam divides each update by √v, so where a gradient is
near zero a rounding difference moves the update by a visible fraction of lr (measured
≤ 2e-4); a wrong reduction (a missing group, a factor) moves the second loss by > 1e-3.
Adam's moments within 1e-5 (measured ≤ 3e-7).
"""

import pytest
import torch
from micro_batches import lean_micro_batch
from worlds import HUNG_S

import minidist
from minidist import comm
from minidist.compose import parallelize
from minidist.compose.dims import Grid, ParallelDims, coordinates, grid_groups
from minidist.compose.fixture import build, bytes_by_kind, data_rows, reference, run_rank
from minidist.models import lm_loss
from minidist.runtime.device import rank_device
from minidist.training import max_abs_diff

LOSS_TOL, PARAM_TOL, OPTIM_TOL = 1e-5, 1e-3, 1e-5
_REFS: dict = {}


def ref(name):
    if name not in _REFS:
        _REFS[name] = reference(name)
    return _REFS[name]


def check(name, result):
    want = ref(name)
    assert result["losses"] == pytest.approx(want["losses"], abs=LOSS_TOL)
    assert max_abs_diff(result["params"], want["params"]) < PARAM_TOL
    assert max_abs_diff(result["optim"], want["optim"]) < OPTIM_TOL


def several(layouts):
    """Run several layouts one after the other on one world (one launch, many checks), each
    with the fewest micro-batches that run all of it (`lean_micro_batch`)."""
    return [run_rank(name, dims, micro_batch=lean_micro_batch(dims)) for name, dims in layouts]


LAYOUTS_8 = [
    ("gpt", dict(dp_shard=2, tp=2, sp=True, pp=2)),
    ("gpt", dict(dp_shard=2, cp=2, tp=2)),
    ("gpt", dict(tp=2, sp=True, cp=2, pp=2, schedule="interleaved", virtual=2)),
    ("moe", dict(dp_shard=2, cp=2, ep=2, pp=2)),
    ("moe", dict(dp_shard=2, ep=2, tp=2, pp=2)),  # experts whole on each tp rank
    ("llama", dict(dp_shard=2, tp=2, sp=True, pp=2)),
    ("llama", dict(tp=4, cp=2, sp=True)),  # kv_heads = 2: K, V replicated over tp = 4
]


def test_the_issues_layouts_on_8_ranks_equal_one_process():
    results = minidist.launch(several, 8, LAYOUTS_8, timeout_s=600, idle_s=HUNG_S)
    for i, (name, _) in enumerate(LAYOUTS_8):
        check(name, results[0][i])
        for rank in results[1:]:  # every rank reports the same curve
            assert rank[i]["losses"] == results[0][i]["losses"]


def test_grid_puts_tp_innermost_and_pp_outermost():
    dims = ParallelDims(dp_replicate=2, dp_shard=2, cp=2, tp=2, pp=2, ep=2)
    g = grid_groups(dims)
    assert g["tp"][0] == [0, 1] and g["cp"][0] == [0, 2] and g["dp_shard"][0] == [0, 4]
    assert g["dp_replicate"][0] == [0, 8] and g["pp"][0] == [0, 16]
    assert g["dp_shard_cp"][0] == [0, 2, 4, 6] and g["ep"][0] == [0, 2]
    assert g["ep_shard"][0] == [0, 4] and g["expert_dp"][0] == [0, 4, 8, 12]
    for kind, lists in g.items():  # every rank in exactly one group of each kind
        assert sorted(r for rs in lists for r in rs) == list(range(32)), kind
    assert coordinates(dims, 31) == dict(pp=1, dp_replicate=1, dp_shard=1, cp=1, tp=1)
    for pp in (3, 4):  # the tied embedding's two copies: the first and the last stage
        assert grid_groups(ParallelDims(tp=2, pp=pp))["embedding"] == [
            [0, 2 * pp - 2],
            [1, 2 * pp - 1],
        ]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(tp=0), "tp=0 must be an int >= 1"),
        (dict(ep=3, dp_shard=2), "ep=3 must divide dp_shard × cp"),
        (dict(sp=True), "sp=True needs tp > 1"),
        (dict(virtual=2), "virtual=2 needs schedule='interleaved'"),
        (dict(schedule="x"), "schedule='x' must be one of"),
    ],
)
def test_bad_dims_are_refused_naming_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ParallelDims(**kwargs)


def test_bad_sizes_for_the_model_or_world_are_refused():
    with pytest.raises(ValueError, match="tp=8 must divide the heads=4"):
        ParallelDims(tp=8).check_model(heads=4, layers=4, seq_len=16)
    with pytest.raises(ValueError, match="ep=4 must divide the experts=6"):
        ParallelDims(dp_shard=4, ep=4).check_model(heads=4, layers=4, seq_len=16, experts=6)
    with pytest.raises(ValueError, match="need at least one layer each, more than the layers=4"):
        ParallelDims(pp=5).check_model(heads=4, layers=4, seq_len=16)
    ParallelDims(pp=3).check_model(heads=4, layers=4, seq_len=16)  # uneven: 2, 1, 1
    # a rank of ZB-V or of interleaving holds 2 chunks: pp 2 needs 4 layers, not 2
    for two_chunks in (dict(schedule="zb-v"), dict(schedule="interleaved", virtual=2)):
        with pytest.raises(ValueError, match=r"2 × 2 stages need at least one layer each"):
            ParallelDims(pp=2, **two_chunks).check_model(heads=4, layers=3, seq_len=16)
    # zig-zag gives each cp rank 2 chunks: cp 2 needs a length divisible by 4, 6 is not
    with pytest.raises(ValueError, match=r"length 6 must divide by 2·cp = 4"):
        ParallelDims(cp=2).check_model(heads=4, layers=4, seq_len=6)
    with pytest.raises(ValueError, match=r"length 12 must divide by 2·cp·tp \(sp\) = 8"):
        ParallelDims(cp=2, tp=2, sp=True).check_model(heads=4, layers=4, seq_len=12)
    with pytest.raises(ValueError, match="must equal the world size 8"):
        ParallelDims(tp=2, pp=2).check_world(8)


def test_the_grid_picture_has_a_panel_per_kind_and_refuses_an_unknown_one():
    from minidist.compose.plots import plot_grid

    fig = plot_grid(ParallelDims(dp_shard=2, cp=2, tp=2, pp=2, ep=2))
    assert [ax.get_title(loc="left") for ax in fig.axes][:2] == [
        "tp: 8 groups of 2",
        "cp: 8 groups of 2",
    ]
    import matplotlib.pyplot as plt

    plt.close(fig)
    with pytest.raises(ValueError, match="kind='dp' must be one of"):
        plot_grid(ParallelDims(), kinds=("dp",))


def test_what_is_not_composed_is_refused_before_any_group_is_made():
    from minidist.compose import parallelize
    from minidist.compose.fixture import build
    from minidist.compose.layout_check import check_course_layout
    from minidist.expert_parallel.gpt import moe_gpt
    from minidist.models import GPTConfig

    moe, _ = build("moe")
    with pytest.raises(ValueError, match="ep=3 must divide dp_shard × cp"):
        parallelize(moe, ParallelDims(dp_shard=2, ep=3))
    dropping = moe_gpt(GPTConfig(seq_len=16, layers=4, heads=4, hidden=32), experts=4)
    with pytest.raises(ValueError, match="capacity_factor=1.0 drops tokens"):
        parallelize(dropping, ParallelDims())
    # top-2 of 4 experts at capacity factor 2: capacity = 2·T·2/4 = T tokens, none dropped
    cfg = GPTConfig(seq_len=16, layers=4, heads=4, hidden=32)
    check_course_layout(moe_gpt(cfg, experts=4, k=2, capacity_factor=2.0), ParallelDims())
    with pytest.raises(ValueError, match="capacity_factor=1.5 drops tokens"):
        check_course_layout(moe_gpt(cfg, experts=4, k=2, capacity_factor=1.5), ParallelDims())
    gpt, _ = build("gpt")
    with pytest.raises(ValueError, match="precision='fp16' must be"):
        parallelize(gpt, ParallelDims(), precision="fp16")
    with pytest.raises(ValueError, match="neither the course GPT"):
        parallelize(torch.nn.Linear(2, 2), ParallelDims())


def _sp_records(name: str, layers: int) -> list[tuple[str, float]]:
    """(tag, ring bytes) of each collective of activations in one step under tp 2 (sp)."""
    from minidist import comm
    from minidist.compose.dims import Grid
    from minidist.compose.fixture import build
    from minidist.compose.parallelize import parallelize

    pdims = ParallelDims(tp=2, sp=True)
    model, batches = build(name, steps=1, global_batch=2, layers=layers)
    engine = parallelize(model, pdims, grid=Grid(pdims), microbatches=1)
    with comm.record() as ledger:
        engine.train_step(batches[0])
    activations = ("sp-gather", "sp-reduce-scatter", "sp-scatter")  # not the norms' gradients
    return [(r.tag, r.ring_bytes) for r in ledger.records if r.tag.startswith(activations)]


@pytest.mark.parametrize("name", ["llama", "gpt"])
def test_sequence_parallelism_sends_korthikantis_4_gathers_and_4_scatters_per_layer(name):
    """Korthikanti et al. 2022 §4.2.2, per layer and micro-batch: the attention's and the
    MLP's input all-gathered once each (q, k, v and gate, up share it), their gradients
    reduce-scattered; each block's output reduce-scattered, its gradient all-gathered: 8
    collectives of (t-1)/t·s·b·h float32 elements. Two more layers add exactly those."""
    t, s, b, h = 2, 16, 2, 32
    one = (t - 1) / t * s * b * h * 4
    few, more = (minidist.launch(_sp_records, t, name, n)[0] for n in (2, 4))
    assert len(more) - len(few) == 2 * 8
    assert sum(x for _, x in more) - sum(x for _, x in few) == 2 * 8 * one
    assert all(x == one for _, x in more)


RECOMPUTED_SPLIT = [  # recomputation with the split backward: once, in B (W reuses it)
    ("gpt", dict(tp=2, sp=True, pp=2, schedule="zb-h1")),
    ("llama", dict(cp=2, pp=2, schedule="zb-v")),
    ("gpt", dict(tp=2, pp=2, schedule="dualpipev")),
]


def recomputed(layouts):
    return [
        run_rank(name, dims, micro_batch=lean_micro_batch(dims), recompute=True)
        for name, dims in layouts
    ]


def test_recompute_with_the_zero_bubble_schedules_equals_one_process():
    results = minidist.launch(recomputed, 4, RECOMPUTED_SPLIT, timeout_s=600, idle_s=HUNG_S)
    for i, (name, _) in enumerate(RECOMPUTED_SPLIT):
        check(name, results[0][i])


SCHEDULES = ("1f1b", "zb-h1", "zb-v", "dualpipev")
SPLIT_LAYOUTS = [  # (model, dims but the schedule, recompute)
    ("gpt", dict(tp=2, pp=2), False),
    ("gpt", dict(tp=2, sp=True, pp=2), False),
    ("gpt", dict(cp=2, pp=2), False),
    ("gpt", dict(tp=2, pp=2), True),
    ("gpt", dict(cp=2, pp=2), True),
    ("llama", dict(tp=2, sp=True, pp=2), True),
    ("moe", dict(dp_shard=2, ep=2, pp=2), False),
]


def grads_and_bytes(cases) -> list[tuple[dict, float, float, float]]:
    """Per (name, dims, recompute): the whole reduced gradients of one step of the global
    batch and this rank's tp, cp and ep bytes in it."""
    out = []
    for name, dims, recompute in cases:
        pdims = ParallelDims(**dims)
        grid = Grid(pdims)
        model, batches = build(name, steps=1)
        rows = data_rows(grid, 8)
        m = len(rows) // lean_micro_batch(dims)
        engine = parallelize(model, pdims, grid=grid, microbatches=m, recompute=recompute)
        pos = engine.ctx.positions.cpu()
        x, y = (t[rows.start : rows.stop, pos].to(rank_device()) for t in batches[0])
        with comm.record() as ledger:
            engine.train_step((x, y))
            engine.finish_gradient_sync()
        sent = bytes_by_kind(ledger, grid)
        out.append((engine.full_grads(), sent["tp"], sent["cp"], sent["ep"]))
    return out


def test_zero_bubble_w_runs_no_collective_and_gives_1f1bs_gradients():
    """ZB-H1, ZB-V, DualPipeV: W back-propagates to the weights from where their paths join the
    input's, so no f, sequence gather or ring K/V pass runs twice, and recomputation runs once
    (W uses what B recomputed). The gradients equal 1F1B's and one process's (measured ≤ 6e-8);
    the tp, cp and ep bytes equal 1F1B's: rank by rank under ZB-H1, over the world under the
    V schedules (their ranks hold other layers). Before, tp 2 · pp 2 sent 756,736 tp bytes over
    the world under ZB-H1 and 822,272 under ZB-V against 1F1B's 592,896; cp 2 · pp 2 720,896
    and 819,200 cp bytes against 524,288; the MoE's all-to-alls 160,256 and 174,848 ep bytes
    against 127,488."""
    cases = [(n, {**d, "schedule": s}, r) for n, d, r in SPLIT_LAYOUTS for s in SCHEDULES]
    ranks = minidist.launch(grads_and_bytes, 4, cases, timeout_s=900, idle_s=HUNG_S)
    for i, (name, dims, recompute) in enumerate(cases):
        model, batches = build(name, steps=1)
        x, y = batches[0]
        lm_loss(model(x), y).backward()
        want = {n: p.grad for n, p in model.named_parameters()}
        first = i - SCHEDULES.index(dims["schedule"])  # the same layout under 1F1B
        grads = ranks[0][i][0]
        assert max_abs_diff(grads, want) < 1e-6, (name, dims, recompute)
        assert max_abs_diff(grads, ranks[0][first][0]) < 1e-6, (name, dims, recompute)
        for k in (1, 2, 3):  # tp, cp, ep
            world = [rank[i][k] for rank in ranks]
            one_f_one_b = [rank[first][k] for rank in ranks]
            assert sum(world) == sum(one_f_one_b), (name, dims, recompute, k)
            if dims["schedule"] == "zb-h1":
                assert world == one_f_one_b, (name, dims, recompute, k)


MOE_TP = [  # experts whole on every tp rank, reduced over expert_dp within it (parallelize);
    # under sp each MoE layer gathers the whole sequence (`experts.sequence_parallel_moe`)
    ("moe", dict(tp=2, dp_shard=2, ep=2)),
    ("moe", dict(tp=2, pp=2)),
    ("moe", dict(tp=2, sp=True, dp_shard=2, ep=2)),
    ("moe", dict(tp=2, sp=True, pp=2, schedule="zb-v")),
]


def test_the_moe_under_tensor_parallelism_equals_one_process():
    results = minidist.launch(several, 4, MOE_TP, timeout_s=600, idle_s=HUNG_S)
    for i, (name, _) in enumerate(MOE_TP):
        check(name, results[0][i])


def test_lean_micro_batches_leave_every_phase_of_the_schedule():
    """tests/micro_batches.py: 2 micro-batches without a pipeline, 2·pp with one, micro-batches
    of one row when the data rank has fewer rows; every count one the schedule accepts."""
    from micro_batches import lean_microbatches

    from minidist.pipeline.schedules import schedule

    assert lean_micro_batch({}) == 4 and lean_microbatches({}) == 2
    assert lean_micro_batch(dict(tp=4, cp=2)) == 4
    assert lean_microbatches(dict(pp=2)) == 4 and lean_microbatches(dict(dp_shard=2, pp=2)) == 4
    assert lean_microbatches(dict(pp=4)) == 8 and lean_microbatches(dict(pp=3)) == 8
    assert lean_microbatches(dict(dp_shard=8)) == 1 and lean_microbatches(dict(dp_shard=4)) == 2
    for _, dims in [*LAYOUTS_8, *MOE_TP, *RECOMPUTED_SPLIT]:
        d = ParallelDims(**dims)
        schedule(d.schedule, d.pp, lean_microbatches(dims), d.virtual)  # accepted
