"""DeepSeek-V3's Table 2 (arXiv:2412.19437, section 3.2.1) as functions: the pipeline bubble,
the parameters and the activations per device of 1F1B, ZB1P, DualPipe and DualPipeV.

PP is the number of pipeline stages (DualPipeV runs them on PP/2 devices, two chunks each);
F is a forward chunk's time, B a full backward's (input and weight gradients), W the weight
gradient's alone and FB an overlapped forward-and-backward pair's. The bubble is a rank's
idle time in one step. `tests/test_deepseek_dualpipe.py` holds them against the simulator:
equal for 1F1B; for ZB1P, DualPipe and DualPipeV the most idle rank equals the formula when
F = W, B = 2F and FB = F + B, and stays under it when W <= F <= B - W and FB <= F + B.
"""

from __future__ import annotations

METHODS = ("1f1b", "zb1p", "dualpipe", "dualpipev")


def _check(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"method={method!r} must be one of {METHODS}")


def bubble(method: str, pp: int, F: float, B: float, W: float = 0.0, FB: float = 0.0) -> float:
    """Table 2's bubble, in the units of F, B, W and FB."""
    _check(method)
    if method == "1f1b":
        return (pp - 1) * (F + B)
    if method == "zb1p":  # W moved into the bubble: B - W is the input gradient
        return (pp - 1) * (F + B - 2 * W)
    return (pp / 2 - 1) * (FB + B - 3 * W)  # both directions fill half the pipeline each


def parameters_per_device(method: str) -> int:
    """Model copies' share per device, in units of one stage's parameters: DualPipe holds a
    stage of each direction's copy; DualPipeV two chunks of one copy on PP/2 devices."""
    _check(method)
    return 2 if method in ("dualpipe", "dualpipev") else 1


def activations_per_device(method: str, pp: int) -> int:
    """Micro-batches' activations (of one stage) a device holds at its peak."""
    _check(method)
    return pp + 1 if method in ("dualpipe", "dualpipev") else pp


def devices(method: str, pp: int) -> int:
    """Devices that run PP stages: DualPipeV folds two stages onto each."""
    _check(method)
    return pp // 2 if method == "dualpipev" else pp
