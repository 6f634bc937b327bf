"""The pipeline checkers pass right answers and name the mistake in wrong ones."""

import pytest

from minidist.course.check import CheckFailed
from minidist.pipeline.check import check_one_f_one_b, check_peak_microbatches

# -- exercise 1: one stage's 1F1B steps -------------------------------------------------------


def f1b_right(stage, stages, microbatches):
    warmup = min(stages - stage - 1, microbatches)
    steps = [("F", i) for i in range(warmup)]
    for i in range(microbatches - warmup):
        steps += [("F", warmup + i), ("B", i)]
    return steps + [("B", i) for i in range(microbatches - warmup, microbatches)]


def f1b_warmup_p_minus_r(stage, stages, microbatches):
    warmup = min(stages - stage, microbatches)
    steps = [("F", i) for i in range(warmup)]
    for i in range(microbatches - warmup):
        steps += [("F", warmup + i), ("B", i)]
    return steps + [("B", i) for i in range(microbatches - warmup, microbatches)]


def f1b_reversed_backwards(stage, stages, microbatches):
    steps = f1b_right(stage, stages, microbatches)
    backs = iter(range(microbatches - 1, -1, -1))
    return [s if s[0] == "F" else ("B", next(backs)) for s in steps]


def f1b_gpipe(stage, stages, microbatches):
    return [("F", i) for i in range(microbatches)] + [("B", i) for i in range(microbatches)]


def f1b_no_cooldown(stage, stages, microbatches):
    warmup = min(stages - stage - 1, microbatches)
    steps = [("F", i) for i in range(warmup)]
    for i in range(microbatches - warmup):
        steps += [("F", warmup + i), ("B", i)]
    return steps


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


@pytest.mark.parametrize(
    "impl, hint",
    [
        (f1b_warmup_p_minus_r, "your warm-up runs p-r = 4 forwards .* 1F1B's is p-r-1 = 3"),
        (f1b_reversed_backwards, r"backwards run in reverse order \(micro-batch 7 first\)"),
        (f1b_gpipe, "you returned GPipe's schedule"),
        (f1b_no_cooldown, r"the backwards of micro-batches \[5, 6, 7\] are missing"),
        (f1b_backward_first, r"\('B', 0\) comes before \('F', 0\)"),
    ],
)
def test_one_f_one_b_names_the_mistake(impl, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_one_f_one_b(impl)


def test_one_f_one_b_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_one_f_one_b(f1b_stub)


# -- exercise 2: how many micro-batches a stage holds ----------------------------------------


def peak_right(stage, stages, microbatches, kind):
    return microbatches if kind == "gpipe" else min(stages - stage, microbatches)


def peak_warmup(stage, stages, microbatches, kind):
    return microbatches if kind == "gpipe" else min(stages - stage - 1, microbatches)


def peak_no_cap(stage, stages, microbatches, kind):
    return microbatches if kind == "gpipe" else stages - stage


def peak_from_end(stage, stages, microbatches, kind):
    return microbatches if kind == "gpipe" else min(stage + 1, microbatches)


def peak_gpipe_for_both(stage, stages, microbatches, kind):
    return microbatches


def peak_1f1b_for_both(stage, stages, microbatches, kind):
    return min(stages - stage, microbatches)


def peak_float(stage, stages, microbatches, kind):
    return float(peak_right(stage, stages, microbatches, kind))


def peak_stub(stage, stages, microbatches, kind):
    raise NotImplementedError("exercise: replace this line with your code")


def test_peak_microbatches_passes(capsys):
    check_peak_microbatches(peak_right)
    out = capsys.readouterr().out
    assert "PASSED" in out and "GPipe [8, 8, 8, 8], 1F1B [4, 3, 2, 1]" in out


@pytest.mark.parametrize(
    "impl, hint",
    [
        (peak_warmup, r"you returned the warm-up count min\(p-r-1, m\)"),
        (peak_no_cap, r"Cap it: min\(p-r, m\)"),
        (peak_from_end, "you counted stages from the end"),
        (peak_gpipe_for_both, "for 1F1B you returned m, GPipe's answer"),
        (peak_1f1b_for_both, "for GPipe you returned 1F1B's answer"),
        (peak_float, r"returned 1.0; return an int"),
    ],
)
def test_peak_microbatches_names_the_mistake(impl, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_peak_microbatches(impl)


def test_peak_microbatches_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_peak_microbatches(peak_stub)
