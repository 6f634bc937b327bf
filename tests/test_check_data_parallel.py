"""The data-parallel checkers pass right answers and name the mistake in wrong ones."""

import pytest
import torch
import torch.distributed as dist

from minidist import comm
from minidist.course.check import CheckFailed
from minidist.data_parallel.check import check_average_gradients, check_grad_bucket

# -- exercise 1: average_gradients ---------------------------------------------------------


def average_right(model):
    for p in model.parameters():
        if p.grad is not None:
            comm.all_reduce(p.grad)
            p.grad.div_(dist.get_world_size())


def average_no_divide(model):
    for p in model.parameters():
        if p.grad is not None:
            comm.all_reduce(p.grad)


def average_divide_twice(model):
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(dist.get_world_size())
            comm.all_reduce(p.grad)
            p.grad.div_(dist.get_world_size())


def average_skip_biases(model):
    for name, p in model.named_parameters():
        if p.grad is not None and name.endswith("weight"):
            comm.all_reduce(p.grad)
            p.grad.div_(dist.get_world_size())


def average_ignores_frozen(model):
    for p in model.parameters():
        comm.all_reduce(p.grad)
        p.grad.div_(dist.get_world_size())


def average_stub(model):
    raise NotImplementedError("exercise: replace this line with your code")


def test_average_gradients_passes(capsys):
    check_average_gradients(average_right)
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize(
    "impl, hint",
    [
        (average_no_divide, "forgot to divide"),
        (average_divide_twice, "divided by N=2 twice"),
        (average_skip_biases, "were skipped"),
        (average_ignores_frozen, "grad is None"),
    ],
)
def test_average_gradients_names_the_mistake(impl, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_average_gradients(impl)


def test_average_gradients_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_average_gradients(average_stub)


# -- exercise 2: GradBucket -----------------------------------------------------------------


class BucketRight:
    """The reference answer; the variants below change one thing each."""

    divide = True

    def __init__(self, params, world_size):
        self.params = params
        self.world_size = world_size
        self.buffer = torch.zeros(sum(p.numel() for p in params))
        self.offsets = self.compute_offsets()
        self.pending = len(params)
        self.work = None

    def compute_offsets(self):
        offsets, offset = {}, 0
        for p in self.params:
            offsets[id(p)] = offset
            offset += p.numel()
        return offsets

    def slot(self, p):
        off = self.offsets[id(p)]
        return self.buffer[off : off + p.numel()]

    def on_grad_ready(self, param):
        self.slot(param).copy_(param.grad.flatten())
        self.pending -= 1
        if self.pending == 0:
            self.launch()

    def launch(self):
        if self.divide:
            self.buffer.div_(self.world_size)
        self.work = comm.all_reduce(self.buffer, async_op=True, tag="bucket")

    def wait(self):
        self.work.wait()
        for p in self.params:
            p.grad.copy_(self.slot(p).view_as(p))
        self.pending = len(self.params)


class BucketNoDivide(BucketRight):
    divide = False


class BucketPerParameter(BucketRight):
    def on_grad_ready(self, param):
        self.slot(param).copy_(param.grad.flatten())
        self.pending -= 1
        comm.all_reduce(param.grad)
        param.grad.div_(self.world_size)

    def wait(self):
        self.pending = len(self.params)


class BucketWrongOffset(BucketRight):
    def compute_offsets(self):
        # the classic slip: a parameter's index instead of the numel of those before it,
        # so slots overlap and a later gradient overwrites part of an earlier one
        return {id(p): i for i, p in enumerate(self.params)}


class BucketEarly(BucketRight):
    def on_grad_ready(self, param):
        self.slot(param).copy_(param.grad.flatten())
        self.pending -= 1
        if self.pending == 1:
            self.launch()


class BucketNoReset(BucketRight):
    def wait(self):
        self.work.wait()
        for p in self.params:
            p.grad.copy_(self.slot(p).view_as(p))


class BucketLastOfList(BucketRight):
    """Launches when the last parameter of its list reports, relying on the arrival order."""

    def on_grad_ready(self, param):
        self.slot(param).copy_(param.grad.flatten())
        if param is self.params[-1]:
            self.launch()

    def wait(self):
        self.work.wait()
        for p in self.params:
            p.grad.copy_(self.slot(p).view_as(p))


class BucketStub(BucketRight):
    def on_grad_ready(self, param):
        raise NotImplementedError("exercise: replace this line with your code")


def test_grad_bucket_passes(capsys):
    check_grad_bucket(BucketRight)
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize(
    "impl, hint",
    [
        (BucketNoDivide, "forgot to divide"),
        (BucketPerParameter, "one per parameter"),
        (BucketWrongOffset, "wrong offsets"),
        (BucketEarly, "before the bucket was full"),
        (BucketNoReset, "reset the pending count"),
        (BucketLastOfList, "last parameter of the list .* gradients can arrive in any order"),
    ],
)
def test_grad_bucket_names_the_mistake(impl, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_grad_bucket(impl)


def test_grad_bucket_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_grad_bucket(BucketStub)
