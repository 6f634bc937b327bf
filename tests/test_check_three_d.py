"""The 3D-parallelism checkers pass right answers and name the mistake in wrong ones.

Each exercise keeps a catalogue of likely mistakes: a wrong answer and the words its message
must contain. The checkers are pure functions: every case runs in milliseconds.
"""

import pytest

from minidist.course.check import CheckFailed
from minidist.three_d import theory
from minidist.three_d.check import BYTE_CASES, FROZEN, check_bytes_per_step, check_rank_of
from minidist.three_d.check_mistakes import variant_bytes

# -- exercise 1: the rank of a grid position --------------------------------------------------


def rank_right(tp_rank, pp_rank, dp_rank, tp, pp, dp):
    return pp_rank * tp * dp + dp_rank * tp + tp_rank


def rank_stub(*args):
    raise NotImplementedError("exercise: replace this line with your code")


def test_rank_of_passes(capsys):
    check_rank_of(rank_right)
    assert "PASSED" in capsys.readouterr().out


RANK_MISTAKES = [
    (lambda i, j, k, t, p, d: j * t * d + i * d + k, "tp and dp are swapped"),
    (lambda i, j, k, t, p, d: k * t * p + j * t + i, "stages are contiguous"),
    (lambda i, j, k, t, p, d: rank_right(i, j, k, t, p, d) + 1, "count from 1"),
    (lambda i, j, k, t, p, d: j * t * d + i, "both map to rank"),
    (lambda i, j, k, t, p, d: i * p * d + j * d + k, "tp_rank is your slowest-moving"),
    (lambda i, j, k, t, p, d: j * t * p + k * t + i, "stepped stages by t·p"),
    (lambda i, j, k, t, p, d: j * t * d + k * d + i, "dp_rank steps by t"),
    (lambda i, j, k, t, p, d: (p - 1 - j) * t * d + k * t + i, "stages run backwards"),
    (lambda i, j, k, t, p, d: float(rank_right(i, j, k, t, p, d)), "return an int"),
    (lambda i, j, k, t, p, d: (j, k, i), "return an int"),
    (lambda i, j, k, t, p, d: rank_right(i, j, k, t, p, d) % 8, "both map to rank"),
    (lambda i, j, k, t, p, d: rank_right(i, j, k, t, p, d) + 64, "is not in 0.."),
    (lambda i, j, k, t, p, d: [0][i], r"raised IndexError.*at line"),
    (lambda i, j, k, t, p: 0, "raised TypeError.*six ints"),
    (
        lambda i, j, k, t, p, d: {0: 1, 1: 0}.get(r := rank_right(i, j, k, t, p, d), r),
        "only some values of",
    ),
]


@pytest.mark.parametrize("fn, words", RANK_MISTAKES)
def test_rank_of_names_the_mistake(fn, words):
    with pytest.raises(CheckFailed, match=words):
        check_rank_of(fn)


def test_rank_of_catalogue_is_large_enough():
    assert len(RANK_MISTAKES) >= 8


def test_rank_of_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_rank_of(rank_stub)


# -- exercise 2: bytes per step by group kind -------------------------------------------------


def make_bytes(**switches):
    def bytes_per_step(stage, tp, pp, dp, trainable, layers, batch, seq, hidden, vocab):
        return variant_bytes(
            stage, tp, pp, dp, trainable, layers, batch, seq, hidden, vocab, **switches
        )

    return bytes_per_step


def test_the_variants_default_is_the_theory():
    for s, layouts in BYTE_CASES:
        for t, p, d in layouts:
            for stage in range(p):
                args = (s["layers"], s["hidden"], s["vocab"], s["seq"], t, FROZEN)
                trainable = theory.trainable_per_rank(stage, p, *args)
                right = theory.bytes_sent_per_step(
                    stage,
                    p,
                    s["layers"],
                    s["batch"],
                    s["seq"],
                    s["hidden"],
                    s["vocab"],
                    t,
                    d,
                    FROZEN,
                )
                assert variant_bytes(stage, t, p, d, trainable, **s) == pytest.approx(right)


def test_bytes_per_step_passes(capsys):
    check_bytes_per_step(make_bytes())
    assert "PASSED" in capsys.readouterr().out


BYTES_MISTAKES = [
    (make_bytes(tp_ring="d"), "ring of d ranks"),
    (make_bytes(tp_in_dp=True), "dp bytes include the tp all-reduces"),
    (make_bytes(tied="none"), "tied embedding's all-reduce is missing"),
    (make_bytes(per_replica=False), "tp bytes are for the global batch"),
    (make_bytes(dp_form="rs"), "all-gather of the\\s+updated parameters"),
    (make_bytes(dp_form="all_reduce"), "padded to a multiple of d"),
    (make_bytes(boundaries="floor_div"), r"layers // pp blocks.*round\(k·layers/pp\)"),
    (make_bytes(boundaries="floor"), r"floor\(k·layers/pp\)"),
    (make_bytes(boundaries="ceil"), r"ceil\(k·layers/pp\)"),
    (make_bytes(tp_payload=True), "tp bytes are the all-reduces' payloads"),
    (make_bytes(extras_everywhere=True), "counted them on every\\s+stage"),
    (make_bytes(tied="full"), "not the whole V·h"),
    (make_bytes(tied="unpadded"), "padded vocabulary's"),
    (make_bytes(tied="every"), "middle stages have no"),
    (make_bytes(tied="p1"), "with p = 1 the one stage"),
    (make_bytes(pp_both=True), "the first stage sends no gradient back"),
    (make_bytes(dp_unit=1), "dp bytes are elements"),
    (make_bytes(dp_form="payload"), "dp bytes are the payloads"),
    (make_bytes(dp_form="2ar"), "as two all-reduces"),
    (make_bytes(dp_form="2ar_unpadded"), "as two all-reduces"),
    (make_bytes(cross_entropy=False), "cross entropy's three all-reduces"),
    (make_bytes(pp_split=True), "divided the boundary activations by t"),
    (make_bytes(tp_ring="d", dp_unit=1), "(?s)ring of d ranks.*dp bytes are elements"),
    (
        lambda *a, **k: {"tp": 0, "pp": 0, "dp": 0},
        r"tp: 23 of 28 cases differ \(e.g. 0x the theory\)",
    ),
    (lambda *a, **k: 0, "keys 'tp', 'pp', 'dp'"),
    (lambda stage, tp, pp, dp, trainable: 0, r"raised TypeError.*by name"),
    (lambda *a, layers, **k: {"tp": [0][layers], "pp": 0, "dp": 0}, r"raised IndexError"),
]


@pytest.mark.parametrize("fn, words", BYTES_MISTAKES)
def test_bytes_per_step_names_the_mistake(fn, words):
    with pytest.raises(CheckFailed, match=words):
        check_bytes_per_step(fn)


def test_bytes_per_step_catalogue_is_large_enough():
    assert len(BYTES_MISTAKES) >= 8


def test_bytes_per_step_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_bytes_per_step(lambda *a, **k: rank_stub())
