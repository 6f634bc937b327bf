"""The recomputation checkers pass right answers and name the mistake in wrong ones."""

import math

import pytest
import torch

from minidist.course.check import CheckFailed
from minidist.recompute.check import check_checkpoint, check_segments

# -- exercise 1: the checkpoint Function ------------------------------------------------------


class Right(torch.autograd.Function):
    """The reference answer; the variants below change one thing each."""

    @staticmethod
    def forward(ctx, fn, x):
        ctx.fn = fn
        ctx.rng_state = torch.get_rng_state()
        ctx.save_for_backward(x)
        with torch.no_grad():
            return fn(x)

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        x = x.detach().requires_grad_(True)
        with torch.random.fork_rng():
            torch.set_rng_state(ctx.rng_state)
            with torch.enable_grad():
                y = ctx.fn(x)
        torch.autograd.backward(y, grad_output)
        return None, x.grad


def _recompute(ctx, x, restore=True, fork=True, grad=True):
    """Recompute ctx.fn(x) the way the variants need."""
    if not restore:
        with torch.enable_grad() if grad else torch.no_grad():
            return ctx.fn(x)
    if not fork:
        torch.set_rng_state(ctx.rng_state)
        with torch.enable_grad():
            return ctx.fn(x)
    with torch.random.fork_rng():
        torch.set_rng_state(ctx.rng_state)
        with torch.enable_grad() if grad else torch.no_grad():
            return ctx.fn(x)


class NoRngRestore(Right):
    @staticmethod
    def backward(ctx, grad_output):
        x = ctx.saved_tensors[0].detach().requires_grad_(True)
        torch.autograd.backward(_recompute(ctx, x, restore=False), grad_output)
        return None, x.grad


class NoFork(Right):
    @staticmethod
    def backward(ctx, grad_output):
        x = ctx.saved_tensors[0].detach().requires_grad_(True)
        torch.autograd.backward(_recompute(ctx, x, fork=False), grad_output)
        return None, x.grad


class UnderNoGrad(Right):
    @staticmethod
    def backward(ctx, grad_output):
        x = ctx.saved_tensors[0].detach().requires_grad_(True)
        torch.autograd.backward(_recompute(ctx, x, grad=False), grad_output)
        return None, x.grad


class NoDetach(Right):
    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        torch.autograd.backward(_recompute(ctx, x), grad_output)
        return None, x.grad


class DetachWithoutRequiresGrad(Right):
    @staticmethod
    def backward(ctx, grad_output):
        x = ctx.saved_tensors[0].detach()
        torch.autograd.backward(_recompute(ctx, x), grad_output)
        return None, x.grad


class ReturnsGradOutput(Right):
    @staticmethod
    def backward(ctx, grad_output):
        x = ctx.saved_tensors[0].detach().requires_grad_(True)
        torch.autograd.backward(_recompute(ctx, x), grad_output)
        return None, grad_output


class AutogradGradOnly(Right):
    @staticmethod
    def backward(ctx, grad_output):
        x = ctx.saved_tensors[0].detach().requires_grad_(True)
        (gx,) = torch.autograd.grad(_recompute(ctx, x), x, grad_output)
        return None, gx


class OneGradient(Right):
    @staticmethod
    def backward(ctx, grad_output):
        x = ctx.saved_tensors[0].detach().requires_grad_(True)
        torch.autograd.backward(_recompute(ctx, x), grad_output)
        return x.grad


class NoGradOutput(Right):
    @staticmethod
    def backward(ctx, grad_output):
        x = ctx.saved_tensors[0].detach().requires_grad_(True)
        torch.autograd.backward(_recompute(ctx, x))
        return None, x.grad


class KeepsTheGraph(Right):
    """Saves the activations anyway: forward records the graph, backward reuses it."""

    @staticmethod
    def forward(ctx, fn, x):
        x = x.detach().requires_grad_(True)
        with torch.enable_grad():
            y = fn(x)
        ctx.x, ctx.y = x, y
        return y.detach()

    @staticmethod
    def backward(ctx, grad_output):
        torch.autograd.backward(ctx.y, grad_output)
        return None, ctx.x.grad


class SavesTheOutputToo(Right):
    @staticmethod
    def forward(ctx, fn, x):
        ctx.fn = fn
        ctx.rng_state = torch.get_rng_state()
        with torch.no_grad():
            y = fn(x)
        ctx.save_for_backward(x, y.clone())
        return y

    @staticmethod
    def backward(ctx, grad_output):
        x = ctx.saved_tensors[0].detach().requires_grad_(True)
        torch.autograd.backward(_recompute(ctx, x), grad_output)
        return None, x.grad


class InputAsAttribute(Right):
    @staticmethod
    def forward(ctx, fn, x):
        ctx.fn, ctx.x = fn, x
        ctx.rng_state = torch.get_rng_state()
        with torch.no_grad():
            return fn(x)

    @staticmethod
    def backward(ctx, grad_output):
        x = ctx.x.detach().requires_grad_(True)
        torch.autograd.backward(_recompute(ctx, x), grad_output)
        return None, x.grad


class Stub(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, x):
        raise NotImplementedError("exercise: replace this line with your code")

    @staticmethod
    def backward(ctx, grad_output):
        raise NotImplementedError("exercise: replace this line with your code")


def test_checkpoint_passes(capsys):
    check_checkpoint(Right)
    out = capsys.readouterr().out
    assert "PASSED" in out and "blocks keep only their 16384-byte inputs" in out


@pytest.mark.parametrize(
    "impl, hint",
    [
        (NoRngRestore, "with dropout .* they differ: the recomputation drew other dropout masks"),
        (NoFork, "random number generator is where block 1's forward began"),
        (UnderNoGrad, "torch.enable_grad"),
        (NoDetach, "Recompute from a detached copy"),
        (DetachWithoutRequiresGrad, "blocks 0 to 2 got none .*requires_grad_"),
        (ReturnsGradOutput, "not the input's gradient"),
        (AutogradGradOnly, "inside the blocks got no gradient .* torch.autograd.backward"),
        (OneGradient, r"return \(None, gradient of x\)"),
        (NoGradOutput, "torch.autograd.backward\\(y, grad_output\\)"),
        (KeepsTheGraph, "as much as without recomputation .* kept the blocks' graphs"),
        (SavesTheOutputToo, "more than the 4 block inputs"),
        (InputAsAttribute, "attribute of ctx"),
    ],
)
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_checkpoint_names_the_mistake(impl, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_checkpoint(impl)


def test_checkpoint_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_checkpoint(Stub)


# -- exercise 2: peak_bytes and best_segment ----------------------------------------------------


def peak_right(layers, activation, boundary, segment):
    if segment is None:
        return layers * activation
    return math.ceil(layers / segment) * boundary + segment * activation


def best_right(layers, activation, boundary):
    return min(range(1, layers + 1), key=lambda k: peak_right(layers, activation, boundary, k))


def best_largest_tie(layers, activation, boundary):
    """Another k with the same smallest peak is as good."""
    peaks = {k: peak_right(layers, activation, boundary, k) for k in range(1, layers + 1)}
    return max(k for k, p in peaks.items() if p == min(peaks.values()))


def peak_boundaries_only(layers, activation, boundary, segment):
    if segment is None:
        return layers * activation
    return math.ceil(layers / segment) * boundary


def peak_one_segment_only(layers, activation, boundary, segment):
    return layers * activation if segment is None else segment * activation


def peak_every_segment(layers, activation, boundary, segment):
    if segment is None:
        return layers * activation
    return math.ceil(layers / segment) * boundary + layers * activation


def peak_no_ceil(layers, activation, boundary, segment):
    if segment is None:
        return layers * activation
    return layers // segment * boundary + segment * activation


def peak_none_is_zero(layers, activation, boundary, segment):
    return 0 if segment is None else peak_right(layers, activation, boundary, segment)


def best_sqrt(layers, activation, boundary):
    return round(math.sqrt(layers))


def best_without_l(layers, activation, boundary):
    return min(range(1, layers), key=lambda k: peak_right(layers, activation, boundary, k))


def best_returns_peak(layers, activation, boundary):
    return min(peak_right(layers, activation, boundary, k) for k in range(1, layers + 1))


def best_largest(layers, activation, boundary):
    return max(range(1, layers + 1), key=lambda k: peak_right(layers, activation, boundary, k))


def stub(*args):
    raise NotImplementedError("exercise: replace this line with your code")


@pytest.mark.parametrize("best", [best_right, best_largest_tie])
def test_segments_pass(best, capsys):
    check_segments(peak_right, best)
    out = capsys.readouterr().out
    assert "PASSED" in out and "ℓ = 1 for 16 blocks" in out


@pytest.mark.parametrize(
    "peak, best, hint",
    [
        (peak_boundaries_only, best_right, "only the boundaries"),
        (peak_one_segment_only, best_right, "one recomputed segment: the"),
        (peak_every_segment, best_right, "one segment at a time"),
        (peak_no_ceil, best_right, "the last one shorter"),
        (peak_none_is_zero, best_right, "without recomputation every layer keeps"),
        (peak_right, best_sqrt, "√L is best only when"),
        (peak_right, best_without_l, "range\\(1, L\\) leaves out L"),
        (peak_right, best_returns_peak, "return a segment length ℓ"),
        (peak_right, best_largest, "take the k in 1..L with the smallest peak"),
    ],
)
def test_segments_name_the_mistake(peak, best, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_segments(peak, best)


def test_segments_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_segments(stub, stub)
