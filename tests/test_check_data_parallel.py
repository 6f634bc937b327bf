"""The data-parallel checkers pass right answers and name the mistake in wrong ones."""

import pytest
import torch
import torch.distributed as dist

from minidist import comm
from minidist.course.check import Mistake, catalogue_messages, names_mistake
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


def average_n_minus_1(model):
    for p in model.parameters():
        if p.grad is not None:
            comm.all_reduce(p.grad)
            p.grad.div_(dist.get_world_size() - 1)


def average_never_waited(model):
    for p in model.parameters():
        if p.grad is not None:
            comm.all_reduce(p.grad, async_op=True)  # the work is dropped
            p.grad.div_(dist.get_world_size())


def average_reduce_to_rank0(model):
    for p in model.parameters():
        if p.grad is not None:
            comm.reduce(p.grad, dst=0)
            p.grad.div_(dist.get_world_size())


def average_broadcast(model):
    for p in model.parameters():
        if p.grad is not None:
            comm.broadcast(p.grad, src=0)


def average_rank0_only(model):
    if dist.get_rank() == 0:
        average_right(model)


def average_through_dist(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad.div_(dist.get_world_size())


def average_a_copy(model):
    for p in model.parameters():
        if p.grad is not None:
            comm.all_reduce(p.grad.clone())  # the reduced copy is dropped
            p.grad.div_(dist.get_world_size())


def average_stub(model):
    raise NotImplementedError("exercise: replace this line with your code")


AVERAGE_MISTAKES = [
    Mistake("right", (average_right,), ""),
    Mistake("no divide", (average_no_divide,), "3x too large.*forgot to divide"),
    Mistake("divide twice", (average_divide_twice,), "divided by N=3 twice"),
    Mistake("skips biases", (average_skip_biases,), "were skipped"),
    Mistake("frozen parameter", (average_ignores_frozen,), "grad is None"),
    Mistake("by N-1", (average_n_minus_1,), "by N-1 = 2; divide by the world size N = 3"),
    Mistake("never waited", (average_never_waited,), "never waited on"),
    Mistake("reduce to rank 0", (average_reduce_to_rank0,), "comm.reduce sums onto one rank"),
    Mistake("broadcast", (average_broadcast,), "broadcast copies one rank's gradient"),
    Mistake(
        "rank 0 only", (average_rank0_only,), "inside a collective.*same collectives", alone=True
    ),
    Mistake("through dist", (average_through_dist,), "Use minidist.comm so it is recorded"),
    Mistake("reduces a copy", (average_a_copy,), "all-reduce ran on a copy"),
]


@pytest.fixture(scope="module")
def average_messages():
    return catalogue_messages(check_average_gradients, AVERAGE_MISTAKES)


def test_average_gradients_passes(average_messages):
    assert average_messages["right"] is None


@pytest.mark.parametrize("mistake", AVERAGE_MISTAKES[1:], ids=lambda m: m.name)
def test_average_gradients_names_the_mistake(mistake, average_messages):
    assert names_mistake(mistake, average_messages[mistake.name]) is None


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


class BucketNeverWaits(BucketRight):
    def wait(self):
        for p in self.params:  # self.work.wait() forgotten
            p.grad.copy_(self.slot(p).view_as(p))
        self.pending = len(self.params)


class BucketBlocking(BucketRight):
    def launch(self):
        self.buffer.div_(self.world_size)
        comm.all_reduce(self.buffer)  # blocks backward in the hook
        self.work = type("Done", (), {"wait": lambda self: None})()


class BucketDivideTwice(BucketRight):
    def wait(self):
        super().wait()
        for p in self.params:
            p.grad.div_(self.world_size)


class BucketFloat64(BucketRight):
    def __init__(self, params, world_size):
        super().__init__(params, world_size)
        self.buffer = torch.zeros(sum(p.numel() for p in params), dtype=torch.float64)


class BucketStub(BucketRight):
    def on_grad_ready(self, param):
        raise NotImplementedError("exercise: replace this line with your code")


BUCKET_MISTAKES = [
    Mistake("right", (BucketRight,), ""),
    Mistake("no divide", (BucketNoDivide,), "forgot to divide"),
    Mistake("per parameter", (BucketPerParameter,), "one per parameter"),
    Mistake("wrong offsets", (BucketWrongOffset,), "wrong offsets"),
    Mistake("early", (BucketEarly,), "before the bucket was full"),
    Mistake("no reset", (BucketNoReset,), "reset the pending count"),
    Mistake(
        "last of list",
        (BucketLastOfList,),
        "last parameter of the list .* gradients can arrive in any order",
    ),
    Mistake("never waits", (BucketNeverWaits,), "never waited on the async all-reduce"),
    Mistake("blocking", (BucketBlocking,), "all-reduce is blocking"),
    Mistake("divide twice", (BucketDivideTwice,), "divided by N=3 twice"),
    Mistake("float64 buffer", (BucketFloat64,), "buffer is float64"),
]


@pytest.fixture(scope="module")
def bucket_messages():
    return catalogue_messages(check_grad_bucket, BUCKET_MISTAKES)


def test_grad_bucket_passes(bucket_messages):
    assert bucket_messages["right"] is None


@pytest.mark.parametrize("mistake", BUCKET_MISTAKES[1:], ids=lambda m: m.name)
def test_grad_bucket_names_the_mistake(mistake, bucket_messages):
    assert names_mistake(mistake, bucket_messages[mistake.name]) is None


def test_grad_bucket_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_grad_bucket(BucketStub)
