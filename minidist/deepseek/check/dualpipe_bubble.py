"""Exercise: DualPipe's bubble, Table 2 of DeepSeek-V3 (arXiv:2412.19437, section 3.2.1).

The learner writes `bubble(pp, F, B, W, FB)`: the idle time of a DualPipe (or DualPipeV)
rank for pp pipeline stages, a forward chunk's time F, a full backward's B, the weight
gradient's W and an overlapped forward-and-backward pair's FB. The checker samples pp over
DualPipe's even sizes and DualPipeV's 2 × ranks for odd rank counts too, with costs that
tell each catalogued mistake from the others.
"""

from __future__ import annotations

from numbers import Real

from ...course.check import call_learner, fail, passed
from ..theory import bubble as _table_2

# (pp, F, B, W, FB): DualPipe's pp of 2 to 8, DualPipeV's 2n stages for n = 3, 5, 7 ranks
CASES = [
    (2, 1.0, 2.0, 0.5, 2.6),
    (4, 1.0, 2.0, 0.5, 2.6),
    (6, 1.3, 2.9, 0.8, 3.7),
    (8, 0.7, 1.6, 0.4, 2.0),
    (10, 1.1, 2.3, 0.9, 3.1),
    (14, 2.0, 4.5, 1.2, 6.0),
    (8, 1.0, 2.0, 1.0, 3.0),
]


def _right(pp, F, B, W, FB):
    return _table_2("dualpipe", pp, F, B, W, FB)


MISTAKES = {
    "(PP - 1) instead of (PP/2 - 1): each direction fills only half of the pipeline, so "
    "DualPipe waits for PP/2 - 1 chunk slots": lambda pp, F, B, W, FB: (pp - 1) * (FB + B - 3 * W),
    "(PP/2) instead of (PP/2 - 1): the first rank of each direction never waits": (
        lambda pp, F, B, W, FB: pp / 2 * (FB + B - 3 * W)
    ),
    "(PP - 1)/2 instead of PP/2 - 1": lambda pp, F, B, W, FB: (pp - 1) / 2 * (FB + B - 3 * W),
    "both directions counted: (PP - 2) is twice the bubble; one rank idles (PP/2 - 1)(...)": (
        lambda pp, F, B, W, FB: (pp - 2) * (FB + B - 3 * W)
    ),
    "W counted twice, not three times (-2W is ZB1P's): DualPipe moves three weight-gradient "
    "chunks into the bubble, -3W": lambda pp, F, B, W, FB: (pp / 2 - 1) * (FB + B - 2 * W),
    "W subtracted once: DualPipe moves three weight-gradient chunks into the bubble, -3W": (
        lambda pp, F, B, W, FB: (pp / 2 - 1) * (FB + B - W)
    ),
    "F&B taken as F + B: FB is the time of the overlapped pair, shorter than F + B": (
        lambda pp, F, B, W, FB: (pp / 2 - 1) * (F + B + B - 3 * W)
    ),
    "the + B is missing: (PP/2 - 1)(F&B + B - 3W)": lambda pp, F, B, W, FB: (
        (pp / 2 - 1) * (FB - 3 * W)
    ),
    "F in place of B: (PP/2 - 1)(F&B + B - 3W), B the full backward": lambda pp, F, B, W, FB: (
        (pp / 2 - 1) * (FB + F - 3 * W)
    ),
    "1F1B's bubble, (PP - 1)(F + B): DualPipe's is (PP/2 - 1)(F&B + B - 3W)": (
        lambda pp, F, B, W, FB: (pp - 1) * (F + B)
    ),
    "ZB1P's bubble, (PP - 1)(F + B - 2W): DualPipe's is (PP/2 - 1)(F&B + B - 3W)": (
        lambda pp, F, B, W, FB: (pp - 1) * (F + B - 2 * W)
    ),
}


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(b))  # sums of a few floats


def check_dualpipe_bubble(bubble) -> None:
    """bubble(pp, F, B, W, FB) against Table 2's DualPipe row on sampled sizes and costs."""
    got = []
    for case in CASES:
        value = call_learner(bubble, *case, what=f"bubble{case}")
        if isinstance(value, bool) or not isinstance(value, Real):
            fail(f"bubble{case} returned {type(value).__name__}: return a number (a time).")
        got.append(float(value))
    if all(_close(g, _right(*c)) for g, c in zip(got, CASES)):
        passed(f"(PP/2 - 1)(F&B + B - 3W) on {len(CASES)} sizes, pp 2 to 14")
        return
    for name, alt in MISTAKES.items():
        if all(_close(g, alt(*c)) for g, c in zip(got, CASES)):
            fail(f"bubble: {name}.")
    case, value = next((c, g) for g, c in zip(got, CASES) if not _close(g, _right(*c)))
    fail(
        f"bubble{case} (pp, F, B, W, FB): got {value:.6g}, want {_right(*case):.6g} = "
        "(PP/2 - 1)(F&B + B - 3W)."
    )
