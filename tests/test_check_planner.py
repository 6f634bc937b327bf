"""The planner checkers pass right answers, report stubs as not implemented, and name the
mistake in wrong ones (lesson 13's exercises)."""

import pytest

from minidist import comm
from minidist.course.check import CheckFailed
from minidist.planner.check import check_bytes_per_step, check_pipeline_prediction


def stub(*args):
    raise NotImplementedError("exercise: replace this line with your code")


# -- exercise 1: bytes per step ----------------------------------------------------------------


def make_bytes(
    pad="each",
    element=4,
    ring="ring",
    reduce="rs",
    gathers="right",
    ddp_pad=False,
    ddp_gather=False,
):
    """A learner's `bytes_per_step`, written out, with the named parts changed: `pad` each
    piece, "none", "total" or "one_more"; `element` bytes; `ring`: "ring", "whole" or
    "ar_once"; ZeRO/FSDP's gradient `reduce`: "rs", "ar" or "none"; `gathers`: "right",
    "none", "once", "twice", "root_first" or "fsdp" (for ZeRO-1/2)."""

    def bytes_per_step(numels, world, zero):
        n = world

        def sent(op, size):
            if ring == "whole":
                return size * (2 if op == "all_reduce" else 1)
            if ring == "ar_once" and op == "all_reduce":
                return comm.ring_bytes("reduce_scatter", size, n)
            return comm.ring_bytes(op, size, n)

        def padded(e):
            if pad == "none" or (zero == 0 and not ddp_pad):
                return e
            return (e // n + 1) * n if pad == "one_more" else -(-e // n) * n

        sizes = [element * padded(e) for e in numels]
        if zero == 0:
            total = sum(sizes)
            return sum(sent("all_reduce", b) for b in sizes) + (
                sent("all_gather", total) if ddp_gather else 0
            )
        total = element * -(-sum(numels) // n) * n if pad == "total" else sum(sizes)
        reduced = {"rs": sent("reduce_scatter", total), "ar": sent("all_reduce", total), "none": 0}[
            reduce
        ]
        root = element * -(-numels[-1] // n) * n if pad == "total" else sizes[-1]
        first = element * -(-numels[0] // n) * n if pad == "total" else sizes[0]
        if zero in (1, 2):
            g = {"none": 0, "fsdp": 2 * total - root}.get(gathers, total)
        else:
            fsdp = 2 * total - root
            g = {
                "right": fsdp,
                "fsdp": fsdp,
                "once": total,
                "twice": 2 * total,
                "root_first": 2 * total - first,
                "none": 0,
            }[gathers]
        return reduced + sent("all_gather", g)

    return bytes_per_step


def test_bytes_per_step_passes(capsys):
    check_bytes_per_step(make_bytes())
    assert "PASSED" in capsys.readouterr().out


def _index_past_the_end(numels, world, zero):
    return comm.ring_bytes("all_reduce", 4 * numels[world + len(numels)], world)


def _divides_by_world_minus_two(numels, world, zero):
    return 4 * sum(numels) * 2 * (world - 1) / (world - 2)


def _list_as_payload(numels, world, zero):
    return comm.ring_bytes("all_reduce", numels, world)


def _op_misspelt(numels, world, zero):
    return sum(comm.ring_bytes("allreduce", 4 * e, world) for e in numels)


def _own_error(numels, world, zero):
    if zero == 3:
        raise ValueError("FSDP needs the unit sizes")
    return make_bytes()(numels, world, zero)


# A catalogue of likely mistakes: (wrong answer, words its message must contain).
BYTES_MISTAKES = [
    (make_bytes(pad="none"), ["padded to a multiple of N", "pad each bucket"]),
    (make_bytes(gathers="none"), ["an all-gather puts the updated parameters back"]),
    (make_bytes(gathers="once"), ["all-gathers them again for its backward"]),
    (make_bytes(gathers="twice"), ["root unit", "not resharded"]),
    (make_bytes(gathers="root_first"), ["root unit is the last in numels"]),
    (make_bytes(gathers="fsdp"), ["ZeRO-1/2 keep the whole parameters"]),
    (make_bytes(ring="whole"), ["(N-1)/N of the message", "1/2 of what you counted"]),
    (make_bytes(ring="ar_once"), ["2(N-1)/N", "one (N-1)/N pass"]),
    (make_bytes(element=1), ["in elements"]),
    (make_bytes(element=2), ["16-bit type", "float32, 4 bytes"]),
    (make_bytes(element=32), ["in bits"]),
    (make_bytes(pad="total"), ["you padded the total", "per bucket"]),
    (make_bytes(pad="one_more"), ["ceil(numel/N)·N, not (numel//N + 1)·N"]),
    (make_bytes(ddp_pad=True), ["DDP all-reduces each bucket as it is", "nothing is padded"]),
    (make_bytes(ddp_gather=True), ["DDP gathers nothing"]),
    (make_bytes(reduce="ar"), ["reduce-scatter the gradients", "not the all-reduce"]),
    (make_bytes(reduce="none"), ["still have to be summed"]),
    (make_bytes(pad="none", element=1), ["padded to a multiple of N", "in elements"]),
    (
        lambda numels, world, zero: make_bytes()(numels, world, zero) + 1,
        ["1.0000x (+1 bytes)", "the planner counts all-reduce 107,648"],
    ),
    (lambda numels, world, zero: None, ["did not return a number", "None"]),
    (lambda numels, world, zero: "12", ["did not return a number", "'12'"]),
    (_index_past_the_end, ["raised IndexError", "_index_past_the_end", "one entry per bucket"]),
    (_divides_by_world_minus_two, ["raised ZeroDivisionError", "(N-1)/N with N = world"]),
    (_list_as_payload, ["raised TypeError", "a byte count"]),
    (_op_misspelt, ["raised KeyError", "'allreduce'", "underscores"]),
    (_own_error, ["raised ValueError: FSDP needs the unit sizes", "_own_error"]),
]


@pytest.mark.parametrize("fn, words", BYTES_MISTAKES)
def test_bytes_per_step_names_the_mistake(fn, words):
    with pytest.raises(CheckFailed) as err:
        check_bytes_per_step(fn)
    for word in words:
        assert word in str(err.value), (word, str(err.value))
    assert "Traceback" not in str(err.value)


def test_bytes_per_step_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_bytes_per_step(stub)


# -- exercise 2: bubble and activations of a pipeline -----------------------------------------


def make_pipeline(bubble="share", held="right", scale=1, swap=False):
    """A learner's `pipeline_prediction` with the named reading of the bubble and of the
    micro-batches the first stage holds, its bytes scaled by `scale`, the tuple `swap`ped."""

    def pipeline_prediction(pp, microbatches, schedule, microbatch_bytes):
        p, m = pp, microbatches
        share = (p - 1) / (m + p - 1)
        b = {
            "share": share,
            "ratio": (p - 1) / m,
            "p": p / (m + p),
            "p_over": p / (m + p - 1),
            "denominator": (p - 1) / (m + p),
            "percent": 100 * share,
            "busy": m / (m + p - 1),
            "slots": p - 1,
            "int": (p - 1) // (m + p - 1),
            "twice": 2 * (p - 1) / (m + 2 * p - 2),
            "1f1b_none": 0 if schedule == "1f1b" else share,
            "1f1b_halved": (p - 1) / (2 * m + p - 1) if schedule == "1f1b" else share,
        }[bubble]
        right = m if schedule == "gpipe" else min(p, m)
        n = {
            "right": right,
            "all": m,  # GPipe's count for 1F1B too
            "no_min": m if schedule == "gpipe" else p,
            "one_less": right - 1,
            "gpipe_as_1f1b": min(p, m),
            "gpipe_p": p if schedule == "gpipe" else right,
            "one": 1,
            "max": m if schedule == "gpipe" else max(p, m),
            "all_stages": p * right,
        }[held]
        out = (b, n * microbatch_bytes * scale)
        return out[::-1] if swap else out

    return pipeline_prediction


def test_pipeline_prediction_passes(capsys):
    check_pipeline_prediction(make_pipeline())
    assert "PASSED" in capsys.readouterr().out


def _schedule_table(pp, microbatches, schedule, microbatch_bytes):
    return (pp - 1) / (microbatches + pp - 1), {"GPipe": microbatches}[schedule] * microbatch_bytes


def _slots_per_stage(pp, microbatches, schedule, microbatch_bytes):
    return (pp - 1) / (microbatches - pp), 0


PIPELINE_MISTAKES = [
    (
        make_pipeline(bubble="ratio"),
        ["Narayanan et al. 2021's bubble over the ideal time", "idle over total"],
    ),
    (make_pipeline(bubble="p"), ["p-1 slots, not p"]),
    (make_pipeline(bubble="p_over"), ["p-1 slots, not p"]),
    (make_pipeline(bubble="denominator"), ["m + p - 1 slots", "not m + p"]),
    (make_pipeline(bubble="twice"), ["not two separate p-1 waits"]),
    (make_pipeline(bubble="percent"), ["a fraction of the step", "not a percentage"]),
    (make_pipeline(bubble="busy"), ["the share of the step a stage is busy"]),
    (make_pipeline(bubble="slots"), ["idle time in slots", "divide by its m+p-1"]),
    (make_pipeline(bubble="int"), ["integer division"]),
    (make_pipeline(bubble="1f1b_none"), ["1F1B reorders GPipe's work", "what it saves is memory"]),
    (make_pipeline(bubble="1f1b_halved"), ["does not shorten the fill", "only interleaving"]),
    (make_pipeline(held="all"), ["That is GPipe's peak"]),
    (make_pipeline(held="no_min"), ["min(p, m)", "never more than exist"]),
    (make_pipeline(held="one_less"), ["one more forward"]),
    (make_pipeline(held="gpipe_as_1f1b"), ["That is 1F1B's peak"]),
    (make_pipeline(held="gpipe_p"), ["however many stages"]),
    (make_pipeline(held="one"), ["not one"]),
    (make_pipeline(held="max"), ["not max(p, m)"]),
    (make_pipeline(held="all_stages"), ["every stage's activations"]),
    (make_pipeline(scale=4), ["already in bytes", "multiply it by 4"]),
    (make_pipeline(held="all", scale=4), ["That is GPipe's peak", "multiply it by 4"]),
    (make_pipeline(swap=True), ["activation bytes first", "in that order"]),
    (lambda *args: 0.5, [r"(bubble, activation_bytes)"]),
    (lambda *args: (0.5, "many"), ["two numbers"]),
    (_schedule_table, ["raised KeyError: 'gpipe'", "_schedule_table", "lower case"]),
    (_slots_per_stage, ["raised ZeroDivisionError", "m + p - 1 slots"]),
]


@pytest.mark.parametrize("fn, words", PIPELINE_MISTAKES)
def test_pipeline_prediction_names_the_mistake(fn, words):
    with pytest.raises(CheckFailed) as err:
        check_pipeline_prediction(fn)
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_pipeline_prediction_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_pipeline_prediction(stub)
