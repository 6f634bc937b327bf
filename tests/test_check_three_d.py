"""The 3D-parallelism checkers pass right answers and name the mistake in wrong ones."""

import pytest

from minidist import comm
from minidist.course.check import CheckFailed
from minidist.three_d.check import check_bytes_per_step, check_rank_of

# -- exercise 1: the rank of a grid position --------------------------------------------------


def rank_right(tp_rank, pp_rank, dp_rank, tp, pp, dp):
    return pp_rank * tp * dp + dp_rank * tp + tp_rank


def rank_tp_dp_swapped(tp_rank, pp_rank, dp_rank, tp, pp, dp):
    return pp_rank * tp * dp + tp_rank * dp + dp_rank


def rank_stages_contiguous(tp_rank, pp_rank, dp_rank, tp, pp, dp):
    return dp_rank * tp * pp + pp_rank * tp + tp_rank


def rank_outside(tp_rank, pp_rank, dp_rank, tp, pp, dp):
    return rank_right(tp_rank, pp_rank, dp_rank, tp, pp, dp) + 1


def rank_collide(tp_rank, pp_rank, dp_rank, tp, pp, dp):
    return pp_rank * tp * dp + tp_rank


def rank_stub(*args):
    raise NotImplementedError("exercise: replace this line with your code")


def test_rank_of_passes(capsys):
    check_rank_of(rank_right)
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, words",
    [
        (rank_tp_dp_swapped, "tp and dp are swapped"),
        (rank_stages_contiguous, "stages are contiguous"),
        (rank_outside, "is not in 0.."),
        (rank_collide, "both map to rank"),
    ],
)
def test_rank_of_names_the_mistake(fn, words):
    with pytest.raises(CheckFailed, match=words):
        check_rank_of(fn)


def test_rank_of_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_rank_of(rank_stub)


# -- exercise 2: bytes per step by group kind -------------------------------------------------


def make_bytes(tp_ring=None, tp_on_dp=False, tied=True, per_replica=True, zero="rs+ag"):
    from minidist.megatron.theory import all_reduces_per_step

    def bytes_per_step(stage, tp, pp, dp, trainable, layers, batch, seq, hidden, vocab):
        b = batch // dp if per_replica else batch
        bounds = [round(k * layers / pp) for k in range(pp + 1)]
        n = bounds[stage + 1] - bounds[stage]
        first, last = stage == 0, stage == pp - 1
        calls = all_reduces_per_step(n, b, seq, hidden)
        counts = [(2 * n + first, calls["forward"][1]), (2 * n + last, calls["backward"][1]),
                  (3 * last, calls["cross_entropy"][1])]  # fmt: skip
        ring = tp_ring(tp, dp) if tp_ring else tp
        tp_bytes = sum(c * comm.ring_bytes("all_reduce", 4 * e, ring) for c, e in counts)
        act = 4 * b * seq * hidden
        pp_bytes = act * (stage < pp - 1) + act * (stage > 0)
        if tied and pp > 1 and (first or last):
            pp_bytes += comm.ring_bytes("all_reduce", 4 * (-(-vocab // tp)) * hidden, 2)
        padded = -(-trainable // dp) * dp
        dp_bytes = {
            "rs+ag": 2 * comm.ring_bytes("all_gather", 4 * padded, dp),
            "rs": comm.ring_bytes("reduce_scatter", 4 * padded, dp),
            "all_reduce": comm.ring_bytes("all_reduce", 4 * trainable, dp),
        }[zero]
        if tp_on_dp:
            dp_bytes += tp_bytes
        return {"tp": tp_bytes, "pp": pp_bytes, "dp": dp_bytes}

    return bytes_per_step


def test_bytes_per_step_passes(capsys):
    check_bytes_per_step(make_bytes())
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, words",
    [
        (make_bytes(tp_ring=lambda t, d: d), "ring of d"),
        (make_bytes(tp_on_dp=True), "dp bytes include the tp all-reduces"),
        (make_bytes(tied=False), "tied embedding's all-reduce is missing"),
        (make_bytes(per_replica=False), "for the global batch"),
        (make_bytes(zero="rs"), "all-gather of the updated parameters"),
        (make_bytes(zero="all_reduce"), "padded to a multiple of d"),
    ],
)
def test_bytes_per_step_names_the_mistake(fn, words):
    with pytest.raises(CheckFailed, match=words):
        check_bytes_per_step(fn)


def test_bytes_per_step_wrong_type_is_named():
    with pytest.raises(CheckFailed, match="keys 'tp', 'pp', 'dp'"):
        check_bytes_per_step(lambda *a, **k: 0)


def test_bytes_per_step_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_bytes_per_step(lambda *a, **k: rank_stub())
