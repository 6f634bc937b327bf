"""DualPipeV and DualPipe (DeepSeek-V3, arXiv:2412.19437, section 3.2.1) as schedules: torch's
order, the simulator's bubble against Table 2, the engine against one process.

The order is compared exactly (data). The bubble is a rank's idle time on the simulator,
compared to 1e-9 (sums of a few floats); Table 2 is exact for 1F1B, and for ZB1P, DualPipe
and DualPipeV when F = W, B = 2F and F&B = F + B; with W <= F <= B - W and F&B <= F + B it
is an upper bound on the most idle rank. Engine runs: lesson 17's tolerances
(tests/test_compose_hf.py): losses 1e-5, parameters 1e-3 (Adam's 1/√v magnifies summation
order where a gradient is near 0), Adam's moments 1e-5; measured: losses <= 9.6e-7,
parameters <= 3.6e-5 (DeepSeek-V3), moments <= 3.7e-6.
"""

import argparse

import hf_runs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from worlds import HUNG_S

import minidist
from minidist.deepseek import theory
from minidist.deepseek.dualpipe import dualpipe, torch_dualpipev_order
from minidist.pipeline import schedule, simulate
from minidist.pipeline.schedules import virtual_stage
from minidist.training import max_abs_diff


def test_dualpipev_is_torchs_order_for_every_size_torch_accepts():
    """p 1..6, every m from torch's least (2p) to 3p + 2: equal, overlapped pairs included."""
    for p in range(1, 7):
        for m in range(2 * p, 3 * p + 3):
            ours = schedule("dualpipev", p, m)
            assert [torch_dualpipev_order(p, m, r) for r in range(p)] == ours, (p, m)
    with pytest.raises(ValueError, match="dualpipev needs microbatches=5 >= 2 × stages = 6"):
        schedule("dualpipev", 3, 5)


def idle(timeline) -> list[float]:
    return [timeline.makespan - sum(e - s for _, s, e in st) for st in timeline.stages]


costs = st.tuples(st.floats(0.5, 2.0), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.floats(0, 1))


def split(F: float, a: float, b: float, c: float) -> tuple[float, float, float, float]:
    """(F, B, W, F&B) with W <= F <= B - W and max(F, B) <= F&B <= F + B."""
    W = a * F
    B = F + W + b * F
    return F, B, W, max(F, B) + c * (F + B - max(F, B))


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 6), st.integers(0, 4), costs)
def test_dualpipev_bubble_on_the_simulator_is_table_2s_or_below(p, extra, cost):
    """Dependency-valid (the simulator would raise on a deadlock) for every p, m; the most idle
    rank within (p-1)(F&B + B - 3W) of chunk times (PP = 2p stages), equal at F = W, B = 2F,
    F&B = F + B; every rank holds 2p + 1 chunks' activations at its peak (PP + 1)."""
    F, B, W, FB = split(*cost)
    m = 2 * p + extra
    timeline = simulate(schedule("dualpipev", p, m), F, B - W, W, placement="v", paired=FB)
    assert max(idle(timeline)) <= theory.bubble("dualpipev", 2 * p, F, B, W, FB) + 1e-9
    exact = simulate(schedule("dualpipev", p, m), F, F, F, placement="v", paired=3 * F)
    assert idle(exact) == pytest.approx([theory.bubble("dualpipev", 2 * p, F, 2 * F, F, 3 * F)] * p)
    assert timeline.peak_held() == [theory.activations_per_device("dualpipev", 2 * p)] * p


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([2, 4, 6, 8]), st.integers(0, 3), costs)
def test_dualpipe_bubble_on_the_simulator_is_table_2s_or_below(p, extra, cost):
    """Both directions, m/2 micro-batches each: the same bound and equality as DualPipeV with
    (PP/2 - 1); PP + 1 stage activations per rank at the peak; and the other rows of Table 2:
    1F1B exactly (PP - 1)(F + B) on every rank, ZB-H1 (ZB1P) within (PP - 1)(F + B - 2W)."""
    F, B, W, FB = split(*cost)
    m = 2 * p + 2 * extra
    timeline = simulate(dualpipe(p, m), F, B - W, W, placement="dual", paired=FB)
    assert max(idle(timeline)) <= theory.bubble("dualpipe", p, F, B, W, FB) + 1e-9
    exact = simulate(dualpipe(p, m), F, F, F, placement="dual", paired=3 * F)
    assert idle(exact) == pytest.approx([theory.bubble("dualpipe", p, F, 2 * F, F, 3 * F)] * p)
    assert timeline.peak_held() == [theory.activations_per_device("dualpipe", p)] * p
    one = simulate(schedule("1f1b", p, m), F, B)
    assert idle(one) == pytest.approx([theory.bubble("1f1b", p, F, B)] * p)
    zb = simulate(schedule("zb-h1", p, m), F, B - W, W)
    assert max(idle(zb)) <= theory.bubble("zb1p", p, F, B, W) + 1e-9


def test_dualpipe_is_dualpipev_folded_and_figure_5s_start():
    """Rank r and p-1-r run one order with the directions swapped, DualPipeV's on p/2 ranks
    and m/2 micro-batches; in Figure 5 (p = 8, m = 20) rank 0 starts with 7 forwards of its
    own direction before the first of the other, rank 3 (the middle) with 1."""
    p, m = 8, 20
    steps = dualpipe(p, m)
    for r in range(p):
        mirror = [(op, i, 1 - d, *rest) for op, i, d, *rest in steps[p - 1 - r]]
        assert steps[r] == mirror
        half = schedule("dualpipev", p // 2, m // 2)[min(r, p - 1 - r)]
        assert [s[:2] + s[3:] for s in steps[r]] == [s[:2] + s[3:] for s in half]
    own = [next(k for k, s in enumerate(steps[r]) if s[2] != (r >= p // 2)) for r in range(4)]
    assert own == [7, 5, 3, 1]
    assert sum(s[0] == "F" for s in steps[0]) == m  # m/2 of each direction
    for bad, message in (((7, 20), "stages=7 must be an even"), ((8, 14), "must be >= 2 × stages")):
        with pytest.raises(ValueError, match=message):
            dualpipe(*bad)


def test_table_2_parameters_and_devices():
    assert [theory.parameters_per_device(k) for k in theory.METHODS] == [1, 1, 2, 2]
    assert [theory.devices(k, 8) for k in theory.METHODS] == [8, 8, 8, 4]
    with pytest.raises(ValueError, match="method='zb-v' must be one of"):
        theory.bubble("zb-v", 4, 1, 2)


RUNS = {
    2: [("deepseek_v3", dict(pp=2, schedule="dualpipev"), {})],
    4: [
        ("llama", dict(pp=4, schedule="dualpipev"), {"layers": 8}),
        ("llama", dict(pp=2, dp_shard=2, schedule="dualpipev"), {}),
    ],
}


@pytest.mark.parametrize("world", RUNS)
def test_engine_runs_dualpipev_equal_to_one_process(world):
    """DeepSeek-V3 (latent attention, experts) at pp 2, Llama at pp 4 (8 micro-batches) and
    pp 2 · dp_shard 2 (4 each), a chunk of one layer each: equal to one process."""
    runs = RUNS[world]
    results = minidist.launch(hf_runs.several, world, runs, timeout_s=600, idle_s=HUNG_S)
    for i, (name, _, extra) in enumerate(runs):
        want, got = hf_runs.reference(name, **extra), results[0][i]
        assert got["losses"] == pytest.approx(want["losses"], abs=1e-5)
        assert max_abs_diff(got["params"], want["params"]) < 1e-3
        assert max_abs_diff(got["optim"], want["optim"]) < 1e-5
        assert all(rank[i]["losses"] == got["losses"] for rank in results[1:])


def _train(argvs: list[list[str]]) -> list[dict]:
    from minidist.trainer.cli import dims_of, parse
    from minidist.trainer.loop import train_rank

    return [train_rank(parse(a), dims_of(parse(a))) for a in argvs]


def test_trainer_runs_dualpipev_equal_to_one_process_and_refuses_too_few_microbatches():
    """`train --schedule dualpipev` on the course's Llama (lesson 17's Chunk path: 4 layers,
    pp 2, 8 micro-batches) against the trainer's one-process reference, tests/test_trainer.py's
    tolerances (losses 1e-5, parameters 1e-3); 3 micro-batches for pp 2 refused in the
    parent: one line, exit status 2."""
    import subprocess
    import sys

    from minidist.trainer.cli import parse
    from minidist.trainer.loop import reference

    text = argparse.__file__  # real text this machine has
    argv = [
        "--model",
        "llama",
        "--data",
        text,
        "--seq-len",
        "16",
        "--pp",
        "2",
        "--schedule",
        "dualpipev",
        "--steps",
        "2",
    ]
    got = minidist.launch(_train, 2, [argv], timeout_s=600, idle_s=HUNG_S)[0][0]
    want = reference(parse(argv))
    assert got["losses"] == pytest.approx(want["losses"], abs=1e-5)
    assert max_abs_diff(got["params"], want["params"]) < 1e-3
    bad = ["train", *argv, "--global-batch", "3"]
    run = subprocess.run([sys.executable, "-m", "minidist", *bad], capture_output=True, text=True)
    assert run.returncode == 2
    last = run.stderr.strip().splitlines()[-1]
    assert "--schedule dualpipev needs micro-batches" in last and "= 3 >= 2·pp = 4" in last


@settings(max_examples=40, deadline=None)
@given(
    st.floats(0.5, 2),
    st.floats(0.5, 2),
    st.floats(0.05, 1),
    st.floats(0.05, 1),
    st.floats(0.0, 0.5),
)
def test_figure_4_hides_the_all_to_alls_behind_the_other_chunks_compute(a, m, d, c, pp):
    """Each piece starts when its stream is free and its chunk's previous piece ended; with
    every all-to-all no longer than the compute beside it (dispatch, combine <= attention, MLP)
    and both sends within the last weight gradient, the pair takes its compute time alone."""
    from minidist.deepseek.dualpipe import WAITS_FOR, overlapped_pair, serial_time

    d, c, pp = d * min(a, m), c * min(a, m), pp * a
    segments = overlapped_pair(attention=a, mlp=m, dispatch=d, combine=c, pp=pp)
    ends = {(s.part, s.op): s.end for s in segments}
    for stream in ("compute", "communication"):
        mine = [s for s in segments if s.stream == stream]
        for before, seg in zip([None, *mine], mine):
            free = before.end if before else 0.0
            after = ends[WAITS_FOR[seg.part, seg.op]] if (seg.part, seg.op) in WAITS_FOR else 0.0
            assert seg.start == pytest.approx(max(free, after), abs=1e-12)
    compute = 3 * (a + m)  # forward, input gradient, weight gradient of both parts
    assert max(s.end for s in segments) == pytest.approx(compute, abs=1e-12)
    assert serial_time(segments) == pytest.approx(compute + 2 * (d + c + pp), abs=1e-12)


def test_pictures_draw(tmp_path):
    """Figure 4 and the DualPipe / DualPipeV charts draw; each overlapped pair outlined."""
    import matplotlib

    matplotlib.use("Agg")
    from minidist.deepseek.dualpipe import overlapped_pair
    from minidist.deepseek.plots_pipeline import plot_dual_schedule, plot_overlapped_pair

    plot_overlapped_pair(overlapped_pair(), "Figure 4").savefig(tmp_path / "pair.png")
    fig = plot_dual_schedule(dualpipe(8, 20), "dual", 1, 1, 1, 2.5, "Figure 5")
    pairs = sum(len(s) > 3 for rank in dualpipe(8, 20) for s in rank)
    assert len(fig.axes[0].patches) == pairs
    fig.savefig(tmp_path / "dualpipe.png")
    plot_dual_schedule(schedule("dualpipev", 3, 7), "v", paired=2.5).savefig(tmp_path / "v.png")


@settings(max_examples=30, deadline=None)
@given(
    st.booleans(),
    st.integers(1, 4),
    st.integers(0, 3),
    st.floats(0.5, 2),
    st.floats(0.5, 2),
    st.floats(0.1, 1),
    st.floats(0.5, 4),
    st.floats(0, 1),
)
def test_a_pair_starts_when_its_rank_and_both_inputs_are_ready(dual, n, extra, f, b, w, fb, lat):
    """The simulator's rule for pairs: a lone step as lesson 09's; an overlapped pair starts
    when its rank is free and both its forward's and its backward's inputs have arrived (plus
    the latency between ranks), lasts `paired`, and both results are ready at its end."""
    from minidist.pipeline.schedules import steps_together

    p = 2 * n if dual else n
    m = 2 * p + 2 * extra
    steps = dualpipe(p, m) if dual else schedule("dualpipev", p, m)
    placement = "dual" if dual else "v"
    timeline = simulate(steps, f, b, w, latency=lat, placement=placement, paired=fb)

    def where(s, step):  # (micro-batch key, chain position, chain length, rank of a position)
        c = step[2]
        if dual:
            return (c, step[1]), s if c == 0 else p - 1 - s, p, lambda k: k if c == 0 else p - 1 - k
        return step[1], virtual_stage("dualpipev", s, c, p), 2 * p, lambda k: min(k, 2 * p - 1 - k)

    ends = {}  # every part of a pair ready at the pair's end
    for s, ran in enumerate(timeline.stages):
        k = 0
        while k < len(ran):
            size = steps_together([step for step, _, _ in ran], k)
            for step, _, _ in ran[k : k + size]:
                ends[(step[0], *where(s, step)[:2])] = ran[k + size - 1][2]
            k += size
    for s, ran in enumerate(timeline.stages):
        k, free = 0, 0.0
        while k < len(ran):
            size = steps_together([step for step, _, _ in ran], k)
            ready = 0.0
            for step, _, _ in ran[k : k + size]:
                key, at, total, rank = where(s, step)
                need = {
                    "F": ("F", key, at - 1) if at else None,
                    "B": ("F", key, at) if at == total - 1 else ("B", key, at + 1),
                    "W": None if size > 1 else ("B", key, at),
                }[step[0]]
                if need is not None:
                    ready = max(ready, ends[need] + (lat if rank(need[2]) != rank(at) else 0.0))
            start, end = ran[k][1], ran[k + size - 1][2]
            assert start == pytest.approx(max(free, ready), abs=1e-9)
            assert end - start == pytest.approx(
                fb if size > 1 else {"F": f, "B": b, "W": w}[ran[k][0][0]]
            )
            k, free = k + size, end


def _torch_rank(dims):
    import test_compose_torch_native as native

    from minidist.compose import torch_native

    return torch_native.train_on_rank(native._model(), dims, native._batches(), 4)


@pytest.mark.parametrize("dp_shard", [1, 2])
def test_torchs_own_dualpipev_through_the_same_stages_equals_one_process(dp_shard):
    """`compose.torch_native` with schedule "dualpipev": torch's `ScheduleDualPipeV` (its
    OVERLAP_F_B actions run one after the other on CPUs) on the V placement, 4 micro-batches,
    FSDP2 over dp_shard; tests/test_compose_torch_native.py's tolerances (losses 1e-5,
    parameters 5e-4)."""
    import test_compose_torch_native as native

    dims = native._dims(dp_shard=dp_shard, pp=2, schedule="dualpipev")
    results = minidist.launch(_torch_rank, 2 * dp_shard, dims, timeout_s=300, idle_s=HUNG_S)
    native._check(results, dp_shard, *native._reference())
