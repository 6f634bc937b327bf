"""The pipeline checkers pass right answers and name the mistake in wrong ones.

Each exercise keeps a catalogue of the mistakes learners make: a wrong answer and the words
its message must contain. The checkers are pure functions, so every case runs in
milliseconds.
"""

import pytest

from minidist.course.check import CheckFailed
from minidist.pipeline.check import check_one_f_one_b, check_peak_microbatches

# -- exercise 1: one stage's 1F1B steps -------------------------------------------------------


def f1b(
    stage,
    stages,
    microbatches,
    *,
    warmup=None,
    cap=True,
    order=None,
    pair=("F", "B"),
    first=0,
    cooldown=True,
):
    """1F1B, or one of its mistakes: another warm-up, no cap at m, backwards in another
    order, the steady pair reversed, micro-batches from `first`, no cool-down."""
    w = stages - stage - 1 if warmup is None else warmup(stage, stages)
    w = min(w, microbatches) if cap else w
    back = order(microbatches) if order else list(range(microbatches))
    steps = [("F", i) for i in range(w)]
    for k in range(microbatches - w):
        both = {"F": ("F", w + k), "B": ("B", back[k])}
        steps += [both[pair[0]], both[pair[1]]]
    if cooldown:
        steps += [("B", back[k] if k >= 0 else k) for k in range(microbatches - w, microbatches)]
    return [(op, i + first) for op, i in steps]


def f1b_right(stage, stages, microbatches):
    return f1b(stage, stages, microbatches)


def f1b_backward_first(stage, stages, microbatches):
    steps = f1b_right(stage, stages, microbatches)
    if stage == stages - 1:  # the last stage backwards before it forwards
        steps[0], steps[1] = steps[1], steps[0]
    return steps


def f1b_stub(stage, stages, microbatches):
    raise NotImplementedError("exercise: replace this line with your code")


def test_one_f_one_b_passes(capsys):
    check_one_f_one_b(f1b_right)
    out = capsys.readouterr().out
    assert "PASSED" in out and "bubble 0.273" in out and "[4, 3, 2, 1]" in out


def _crash(stage, stages, microbatches):
    warmup = [("F", i) for i in range(stages - stage - 1)]
    return warmup[:microbatches] + [warmup[microbatches + 5]]


ONE_F_ONE_B_MISTAKES = [
    (lambda r, p, m: f1b(r, p, m, warmup=lambda r, p: p - r), "warm-up runs p-r forwards"),
    (lambda r, p, m: f1b(r, p, m, order=lambda m: list(range(m))[::-1]), "reverse order"),
    (lambda r, p, m: [("F", i) for i in range(m)] + [("B", i) for i in range(m)], "GPipe"),
    (lambda r, p, m: f1b(r, p, m, cooldown=False), r"backwards of micro-batches \[5, 6, 7\]"),
    (f1b_backward_first, r"\('B', 0\) comes before \('F', 0\)"),
    (lambda r, p, m: f1b(r, p, m, warmup=lambda r, p: r), "counted stages from the end"),
    (lambda r, p, m: f1b(r, p, m, warmup=lambda r, p: p - 1), "every stage warms up p-1"),
    (lambda r, p, m: f1b(r, p, m, cap=False), "cap it, min"),
    (lambda r, p, m: f1b(r, p, m, pair=("B", "F")), "backward before the forward"),
    (lambda r, p, m: f1b(r, p, m, first=1), "numbered 1..m"),
    (lambda r, p, m: [(op.lower(), i) for op, i in f1b(r, p, m)], "neither"),
    (lambda r, p, m: (s for s in f1b(r, p, m)), "list.* of your generator"),
    (lambda r, p, m: [f"F{i}" for i in range(m)], "not a string"),
    (lambda r, p, m: f1b(r, p, m) + [("F", 0)], "repeated"),
    (
        lambda r, p, m: f1b(r, p, m, warmup=lambda r, p: max(p - r - 2, 0)),
        "3 forwards before its first backward; 1F1B runs 4",
    ),
    (
        lambda r, p, m: (
            f1b(r, p, m)[: -(p - r) or None] + f1b(r, p, m)[-(p - r) :][::-1]
            if r < p - 1
            else f1b(r, p, m)
        ),
        "step 12 differs: you run \\('B', 7\\), 1F1B runs \\('B', 4\\)",
    ),
    (_crash, "raised IndexError.*at line .* of your code.*Likely cause"),
    (lambda r, p: [], "raised TypeError.*three ints"),
]


@pytest.mark.parametrize("impl, words", ONE_F_ONE_B_MISTAKES)
def test_one_f_one_b_names_the_mistake(impl, words):
    with pytest.raises(CheckFailed, match=words):
        check_one_f_one_b(impl)


def test_one_f_one_b_catalogue_is_large_enough():
    assert len(ONE_F_ONE_B_MISTAKES) >= 8


def test_one_f_one_b_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_one_f_one_b(f1b_stub)


# -- exercise 2: how many micro-batches a stage holds ----------------------------------------


def peak_right(stage, stages, microbatches, kind):
    return microbatches if kind == "gpipe" else min(stages - stage, microbatches)


def peak(one_f_one_b, gpipe=lambda r, p, m: m):
    return lambda r, p, m, kind: gpipe(r, p, m) if kind == "gpipe" else one_f_one_b(r, p, m)


def peak_stub(stage, stages, microbatches, kind):
    raise NotImplementedError("exercise: replace this line with your code")


def test_peak_microbatches_passes(capsys):
    check_peak_microbatches(peak_right)
    out = capsys.readouterr().out
    assert "PASSED" in out and "GPipe [8, 8, 8, 8], 1F1B [4, 3, 2, 1]" in out


def test_peak_microbatches_takes_numpy_ints():
    np = pytest.importorskip("numpy")
    check_peak_microbatches(lambda *a: np.int64(peak_right(*a)))


PEAK_MISTAKES = [
    (peak(lambda r, p, m: min(p - r - 1, m)), r"the warm-up count min\(p-r-1, m\)"),
    (peak(lambda r, p, m: p - r), r"Cap it: min\(p-r, m\)"),
    (peak(lambda r, p, m: min(r + 1, m)), "counted stages from the end"),
    (peak(lambda r, p, m: m), "for 1F1B you returned m, GPipe's answer"),
    (
        peak(lambda r, p, m: min(p - r, m), gpipe=lambda r, p, m: min(p - r, m)),
        "for GPipe you returned 1F1B's answer",
    ),
    (lambda r, p, m, kind: float(peak_right(r, p, m, kind)), r"returned 1.0; return an int"),
    (peak(lambda r, p, m: min(p, m)), "that is stage 0's count only"),
    (peak(lambda r, p, m: min(p - r + 1, m)), "one too many"),
    (peak(lambda r, p, m: min(p - r, m), gpipe=lambda r, p, m: min(p, m)), "capped at p"),
    (peak(lambda r, p, m: min(p - r, m), gpipe=lambda r, p, m: m - r), "not m-r"),
    (
        lambda r, p, m, kind: (
            peak_right(r, p, m, "gpipe" if kind == "GPipe" else kind)
            if kind != "gpipe"
            else min(p - r, m)
        ),
        "lower case",
    ),
    (peak(lambda r, p, m: min(p - r, m - 1) if m > 1 else 1), r"all of them with m <= p-r"),
    (peak(lambda r, p, m: [0, 1][m]), r"raised IndexError.*at line"),
    (peak(lambda r, p, m: min(p - r, m) + (r == 1)), r"stages \[1\] are wrong"),
]


@pytest.mark.parametrize("impl, words", PEAK_MISTAKES)
def test_peak_microbatches_names_the_mistake(impl, words):
    with pytest.raises(CheckFailed, match=words):
        check_peak_microbatches(impl)


def test_peak_microbatches_catalogue_is_large_enough():
    assert len(PEAK_MISTAKES) >= 8


def test_peak_microbatches_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_peak_microbatches(peak_stub)


# -- the learner-call helper the pure checkers share ------------------------------------------


def test_time_limit_stops_a_loop_and_rearms_an_outer_timer():
    import signal

    from minidist.pipeline.check_call import learner_call

    def forever():
        while True:
            pass

    fired = []
    old = signal.signal(signal.SIGALRM, lambda *a: fired.append(True))
    signal.setitimer(signal.ITIMER_REAL, 30.0)
    try:
        with pytest.raises(CheckFailed, match="still running after 0.2 s"):
            learner_call(forever, limit_s=0.2)
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < left < 30.0  # the outer timer runs on
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert not fired
