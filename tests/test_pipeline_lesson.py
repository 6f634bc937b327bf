"""Lesson 09's course side: the recorded timings, the measured timeline, the bytes and the plots."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

import minidist  # noqa: E402
from minidist.pipeline import schedule, simulate, theory  # noqa: E402
from minidist.pipeline.fixture import build_pp, pipeline_on_rank  # noqa: E402
from minidist.pipeline.plots import (  # noqa: E402
    plot_activation_memory,
    plot_bubble_vs_m,
    plot_gantt,
    plot_measured_gantt,
)
from minidist.pipeline.simulate import from_timestamps  # noqa: E402


@pytest.mark.parametrize("kind", ["1f1b", "zb-h1"])
def test_timings_follow_the_schedule_and_bytes_match_theory(kind):
    p, m = 2, 4
    model, batches, _ = build_pp()
    b, s = batches[0][0].shape
    runs = minidist.launch(pipeline_on_rank, p, kind, m, p)
    steps = schedule(kind, p, m)
    for r in runs:
        timings = r["timings"]
        assert [(op, i) for op, i, _, _ in timings] == steps[r["stage"]]
        assert all(start <= end for _, _, start, end in timings)
        assert r["sent_per_step"] == theory.p2p_bytes_sent_per_step(
            r["stage"], p, b, s, model.cfg.hidden, model.cfg.vocab_size
        )
    timeline = from_timestamps([r["timings"] for r in runs])
    assert min(start for st in timeline.stages for _, start, _ in st) == 0
    assert 0 <= timeline.bubble < 1
    # stage 1's forward of micro-batch i starts after stage 0's began (stage 0 stamps its end
    # after posting the send, so stage 1 may start a hair before that end)
    starts = {step: start for step, start, _ in timeline.stages[0]}
    for step, start, _ in timeline.stages[1]:
        if step[0] == "F":
            assert start > starts[step]


def _timings_default_rank():
    from minidist.megatron import ParallelLayout
    from minidist.pipeline import PipelineParallel

    model, batches, loss_fn = build_pp()
    pipe = PipelineParallel(model, loss_fn, ParallelLayout(tp=1, pp=2), "1f1b", 2)
    pipe.train_step(batches[0])
    return pipe.timings


def test_timings_are_off_by_default():
    assert minidist.launch(_timings_default_rank, 2) == [None, None]


def test_p2p_bytes_theory():
    # p = 1: nothing to send; middle stages: activations forward and gradients backward
    assert theory.p2p_bytes_sent_per_step(0, 1, 8, 16, 32, 30) == 0
    assert theory.p2p_bytes_sent_per_step(1, 4, 8, 16, 32, 30) == 2 * 8 * 16 * 32 * 4
    assert theory.p2p_bytes_sent_per_step(0, 4, 8, 16, 32, 30) == 8 * 16 * 32 * 4 + 30 * 32 * 4


@pytest.mark.parametrize(
    "steps, costs",
    [
        (schedule("gpipe", 4, 8), {}),
        (schedule("interleaved", 4, 8, 2), {}),
        (schedule("zb-h1", 4, 8), {"weight": 1.0}),
    ],
)
def test_gantt_draws_one_box_per_step(steps, costs):
    timeline = simulate(steps, **costs)
    fig = plot_gantt(timeline, "x")
    ax = fig.axes[0]
    assert len(ax.collections) == sum(len(st) for st in steps)  # one broken_barh per step
    assert f"{timeline.bubble:.1%}" in ax.get_title()
    assert len(ax.get_yticks()) == 4


def test_measured_gantt_and_other_plots():
    timings = [[("F", 0, 1.0, 1.002), ("B", 0, 1.004, 1.006)], [("F", 0, 1.002, 1.003)]]
    fig = plot_measured_gantt(timings, "real")
    assert fig.axes[0].get_xlabel() == "milliseconds"
    fig = plot_bubble_vs_m(4, (4, 8))
    assert len(fig.axes[0].collections) == 4  # simulated points of four schedules
    fig = plot_activation_memory({"1f1b": [3, 2]}, {"1f1b": [3, 2]})
    assert fig.axes[0].get_xticklabels()[1].get_text() == "stage 1"
