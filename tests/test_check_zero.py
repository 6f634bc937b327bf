"""The ZeRO checkers pass right answers and name the mistake in wrong ones."""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from minidist import comm
from minidist.course.check import Mistake, catalogue_messages, names_mistake
from minidist.zero.check import (
    check_reduce_scatter_bucket,
    check_shard_with_padding,
    check_zero_stage1,
)

# -- exercise 1: shard_with_padding -----------------------------------------------------------


def shard_right(tensor, rank, world_size):
    flat = tensor.reshape(-1)
    chunk = -(-flat.numel() // world_size)
    padded = F.pad(flat, (0, chunk * world_size - flat.numel()))
    return padded[rank * chunk : (rank + 1) * chunk]


def shard_no_padding(tensor, rank, world_size):
    return torch.tensor_split(tensor.reshape(-1), world_size)[rank]


def shard_torch_chunk(tensor, rank, world_size):
    return torch.chunk(tensor.reshape(-1), world_size)[rank]


def shard_floor(tensor, rank, world_size):
    chunk = tensor.numel() // world_size
    return tensor.reshape(-1)[rank * chunk : (rank + 1) * chunk]


def shard_wrong_index(tensor, rank, world_size):
    return shard_right(tensor, (rank + 1) % world_size, world_size)


def shard_pad_with_ones(tensor, rank, world_size):
    flat = tensor.reshape(-1)
    chunk = -(-flat.numel() // world_size)
    padded = F.pad(flat, (0, chunk * world_size - flat.numel()), value=1.0)
    return padded[rank * chunk : (rank + 1) * chunk]


def shard_strided(tensor, rank, world_size):
    flat = tensor.reshape(-1)
    chunk = -(-flat.numel() // world_size)
    return F.pad(flat, (0, chunk * world_size - flat.numel()))[rank::world_size]


def shard_pad_in_front(tensor, rank, world_size):
    flat = tensor.reshape(-1)
    chunk = -(-flat.numel() // world_size)
    padded = F.pad(flat, (chunk * world_size - flat.numel(), 0))
    return padded[rank * chunk : (rank + 1) * chunk]


def shard_always_pads(tensor, rank, world_size):
    flat = tensor.reshape(-1)
    pad = world_size - flat.numel() % world_size  # N, not 0, when N divides numel
    chunk = (flat.numel() + pad) // world_size
    return F.pad(flat, (0, pad))[rank * chunk : (rank + 1) * chunk]


def shard_keeps_a_dimension(tensor, rank, world_size):
    return shard_right(tensor, rank, world_size).unsqueeze(0)


def shard_view(tensor, rank, world_size):
    flat = tensor.view(-1)  # refuses a transposed weight
    chunk = -(-flat.numel() // world_size)
    return F.pad(flat, (0, chunk * world_size - flat.numel()))[rank * chunk : (rank + 1) * chunk]


def shard_fp32_padding(tensor, rank, world_size):
    flat = tensor.reshape(-1)
    chunk = -(-flat.numel() // world_size)
    padded = torch.cat([flat, torch.zeros(chunk * world_size - flat.numel())])  # float32 zeros
    return padded[rank * chunk : (rank + 1) * chunk]


def shard_refuses_uneven(tensor, rank, world_size):
    if tensor.numel() % world_size:
        raise ValueError(f"{tensor.numel()} elements do not divide by {world_size}")
    return shard_right(tensor, rank, world_size)


def shard_off_by_one(tensor, rank, world_size):
    flat = tensor.reshape(-1)
    chunk = -(-flat.numel() // world_size)
    padded = F.pad(flat, (0, chunk * world_size - flat.numel()))
    return padded[rank * chunk + 1 : (rank + 1) * chunk + 1]


def shard_stub(tensor, rank, world_size):
    raise NotImplementedError("exercise: replace this line with your code")


SHARD_MISTAKES = [
    Mistake("right", (shard_right,), ""),
    Mistake("no padding", (shard_no_padding,), r"chunks have \[2, 1\] elements: without padding"),
    Mistake("torch.chunk", (shard_torch_chunk,), "torch.chunk"),
    Mistake("floor division", (shard_floor,), "belong to no rank"),
    Mistake("wrong rank", (shard_wrong_index,), "rank 0 returned chunk 1"),
    Mistake("pads with ones", (shard_pad_with_ones,), r"padding holds \[1.0\] instead of zeros"),
    Mistake("strided", (shard_strided,), "strided split"),
    Mistake("pads in front", (shard_pad_in_front,), "padding went in front"),
    Mistake("always pads", (shard_always_pads,), "already divides by 2: pad"),
    Mistake("keeps a dimension", (shard_keeps_a_dimension,), "flatten first"),
    Mistake("view on a transposed weight", (shard_view,), r"view size.*transposed.*reshape\(-1\)"),
    Mistake("float32 padding", (shard_fp32_padding,), "float32 chunk: keep the tensor's dtype"),
    Mistake("own ValueError", (shard_refuses_uneven,), r"raised ValueError.*shard_refuses_uneven"),
    Mistake("off by one", (shard_off_by_one,), "starts 1 element.s. late.*off-by-one"),
]


@pytest.fixture(scope="module")
def shard_messages():
    return catalogue_messages(check_shard_with_padding, SHARD_MISTAKES)


def test_shard_with_padding_passes(shard_messages):
    assert shard_messages["right"] is None


@pytest.mark.parametrize("mistake", SHARD_MISTAKES[1:], ids=lambda m: m.name)
def test_shard_with_padding_names_the_mistake(mistake, shard_messages):
    assert names_mistake(mistake, shard_messages[mistake.name]) is None


def test_shard_with_padding_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_shard_with_padding(shard_stub)


# -- exercise 2: reduce_scatter_bucket --------------------------------------------------------


def rs_right(flat_grad):
    world = dist.get_world_size()
    out = torch.empty(flat_grad.numel() // world)
    comm.reduce_scatter(out, flat_grad)
    return out.div_(world)


def rs_never_waited(flat_grad):
    n = dist.get_world_size()
    out = torch.empty(flat_grad.numel() // n)
    comm.reduce_scatter(out, flat_grad / n, async_op=True)  # a learner forgets .wait()
    return out


def rs_no_divide(flat_grad):
    out = torch.empty(flat_grad.numel() // dist.get_world_size())
    comm.reduce_scatter(out, flat_grad)
    return out


def rs_divide_twice(flat_grad):
    world = dist.get_world_size()
    out = torch.empty(flat_grad.numel() // world)
    comm.reduce_scatter(out, flat_grad.div(world))
    return out.div_(world)


def rs_all_reduce(flat_grad):
    rank, world = dist.get_rank(), dist.get_world_size()
    comm.all_reduce(flat_grad)
    chunk = flat_grad.numel() // world
    return flat_grad[rank * chunk : (rank + 1) * chunk] / world


def rs_all_reduce_wrong_chunk(flat_grad):
    rank, world = dist.get_rank(), dist.get_world_size()
    comm.all_reduce(flat_grad)
    chunk = flat_grad.numel() // world
    j = (rank + 1) % world
    return flat_grad[j * chunk : (j + 1) * chunk] / world


def rs_all_reduce_whole(flat_grad):
    comm.all_reduce(flat_grad)
    return flat_grad / dist.get_world_size()


def rs_output_too_big(flat_grad):
    out = torch.empty_like(flat_grad)
    comm.reduce_scatter(out, flat_grad)
    return out


def rs_own_chunk(flat_grad):
    rank, world = dist.get_rank(), dist.get_world_size()
    chunk = flat_grad.numel() // world
    return flat_grad[rank * chunk : (rank + 1) * chunk]


def rs_twice(flat_grad):
    world = dist.get_world_size()
    out = torch.empty(flat_grad.numel() // world)
    comm.reduce_scatter(out, flat_grad)
    comm.reduce_scatter(torch.empty_like(out), flat_grad)
    return out.div_(world)


def rs_input_is_a_chunk(flat_grad):
    rank, world = dist.get_rank(), dist.get_world_size()
    chunk = flat_grad.numel() // world
    out = torch.empty(chunk)
    comm.reduce_scatter(out, flat_grad[rank * chunk : (rank + 1) * chunk])  # input: 1/N only
    return out.div_(world)


def rs_n_minus_1(flat_grad):
    world = dist.get_world_size()
    out = torch.empty(flat_grad.numel() // world)
    comm.reduce_scatter(out, flat_grad)
    return out.div_(world - 1)


def rs_rank0_only(flat_grad):
    world = dist.get_world_size()
    out = torch.empty(flat_grad.numel() // world)
    if dist.get_rank() == 0:
        comm.reduce_scatter(out, flat_grad)
    return out.div_(world)


def rs_through_dist(flat_grad):
    world = dist.get_world_size()
    out = torch.empty(flat_grad.numel() // world)
    dist.reduce_scatter_tensor(out, flat_grad)
    return out.div_(world)


def rs_in_place(flat_grad):
    rank, world = dist.get_rank(), dist.get_world_size()
    chunk = flat_grad.numel() // world
    mine = flat_grad[rank * chunk : (rank + 1) * chunk]
    comm.reduce_scatter(mine, flat_grad)  # NCCL's in-place reduce-scatter: right
    return mine / world


def rs_into_chunk0(flat_grad):
    chunk = flat_grad.numel() // dist.get_world_size()
    comm.reduce_scatter(flat_grad[:chunk], flat_grad)  # in place on rank 0 only
    return flat_grad[:chunk] / dist.get_world_size()


def rs_stub(flat_grad):
    raise NotImplementedError("exercise: replace this line with your code")


RS_MISTAKES = [
    Mistake("right", (rs_right,), ""),
    Mistake("no divide", (rs_no_divide,), "forgot to divide by the world size N=3"),
    Mistake("divide twice", (rs_divide_twice,), "divided by N=3 twice"),
    Mistake("all-reduce", (rs_all_reduce,), r"ledger shows \['all_reduce'\].*twice the reduce-s"),
    Mistake("wrong chunk", (rs_all_reduce_wrong_chunk,), "rank 0 holds chunk 1.s mean"),
    Mistake("whole bucket", (rs_all_reduce_whole,), "returned the whole bucket .* An all-reduce"),
    Mistake("output too big", (rs_output_too_big,), "output must hold 1/N of its input"),
    Mistake("own chunk", (rs_own_chunk,), "still holds its own gradient"),
    Mistake("twice", (rs_twice,), "call it once"),
    Mistake("never waited", (rs_never_waited,), "never waited on its work"),
    Mistake("by N-1", (rs_n_minus_1,), "by N-1 = 2; divide by the world size N = 3"),
    Mistake(
        "input is a chunk",
        (rs_input_is_a_chunk,),
        r"rs_input_is_a_chunk.*The input is the whole bucket, flat_grad \(12 elements\)",
    ),
    Mistake(
        "rank 0 only",
        (rs_rank0_only,),
        "rank . failed first, inside a collective.*same collectives",
        alone=True,
    ),
    Mistake("through dist", (rs_through_dist,), "no reduce-scatter went through minidist.comm"),
    Mistake("in place", (rs_in_place,), ""),
    Mistake(
        "output aliases chunk 0",
        (rs_into_chunk0,),
        r"output shares memory with the input but is not this rank's own chunk",
        alone=True,
    ),
]
RS_RIGHT = ("right", "in place")


@pytest.fixture(scope="module")
def rs_messages():
    return catalogue_messages(check_reduce_scatter_bucket, RS_MISTAKES)


@pytest.mark.parametrize("name", RS_RIGHT)
def test_reduce_scatter_bucket_passes(name, rs_messages):
    assert rs_messages[name] is None


@pytest.mark.parametrize(
    "mistake", [m for m in RS_MISTAKES if m.name not in RS_RIGHT], ids=lambda m: m.name
)
def test_reduce_scatter_bucket_names_the_mistake(mistake, rs_messages):
    assert names_mistake(mistake, rs_messages[mistake.name]) is None


def test_reduce_scatter_bucket_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_reduce_scatter_bucket(rs_stub)


# -- exercise 3: ZeroStage1 ---------------------------------------------------------------------


class Stage1Right:
    """The reference answer; the variants below change one thing each."""

    divide = True

    def __init__(self, flat_param, make_optimizer):
        self.flat_param = flat_param
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.chunk = flat_param.numel() // self.world
        self.shard = self.make_shard()
        self.optimizer = make_optimizer([self.shard])

    def make_shard(self):
        start = self.rank * self.chunk
        return nn.Parameter(self.flat_param[start : start + self.chunk])

    def reduce(self, flat_grad):
        out = torch.empty(self.chunk)
        comm.reduce_scatter(out, flat_grad)
        return out.div_(self.world) if self.divide else out

    def gather(self):
        comm.all_gather(self.flat_param, self.shard.detach().clone())

    def step(self, flat_grad):
        self.shard.grad = self.reduce(flat_grad)
        self.optimizer.step()
        self.gather()


class Stage1NoDivide(Stage1Right):
    divide = False


class Stage1NoGather(Stage1Right):
    def gather(self):
        pass


class Stage1CopyNoGather(Stage1Right):
    def make_shard(self):
        start = self.rank * self.chunk
        return nn.Parameter(self.flat_param[start : start + self.chunk].clone())

    def gather(self):
        pass


class Stage1Full(Stage1Right):
    """Plain DP inside: the optimizer steps every parameter."""

    def make_shard(self):
        return nn.Parameter(self.flat_param)

    def step(self, flat_grad):
        comm.all_reduce(flat_grad)
        self.shard.grad = flat_grad.div_(self.world)
        self.optimizer.step()


class Stage1AllReduce(Stage1Right):
    def reduce(self, flat_grad):
        comm.all_reduce(flat_grad)
        start = self.rank * self.chunk
        return flat_grad[start : start + self.chunk] / self.world


class Stage1WrongShard(Stage1Right):
    def make_shard(self):
        start = ((self.rank + 1) % self.world) * self.chunk
        return nn.Parameter(self.flat_param[start : start + self.chunk])


class Stage1Rebinds(Stage1Right):
    def gather(self):
        full = torch.empty_like(self.flat_param)
        comm.all_gather(full, self.shard.detach().clone())
        self.flat_param = full


class Stage1CopyShard(Stage1Right):
    """A copy, not a view: the values come out right through the all-gather."""

    def make_shard(self):
        start = self.rank * self.chunk
        return nn.Parameter(self.flat_param[start : start + self.chunk].clone())


class Stage1GatherBeforeStep(Stage1Right):
    def step(self, flat_grad):
        self.shard.grad = self.reduce(flat_grad)
        self.gather()
        self.optimizer.step()


class Stage1StepBeforeGrad(Stage1Right):
    def step(self, flat_grad):
        self.optimizer.step()
        self.shard.grad = self.reduce(flat_grad)
        self.gather()


class Stage1DivideTwice(Stage1Right):
    def reduce(self, flat_grad):
        return super().reduce(flat_grad / self.world)


class Stage1ByNMinus1(Stage1Right):
    def reduce(self, flat_grad):
        out = torch.empty(self.chunk)
        comm.reduce_scatter(out, flat_grad)
        return out.div_(self.world - 1)


class Stage1InPlaceGather(Stage1Right):
    """No copy: the input is this rank's own chunk of the output, NCCL's in-place all-gather
    (what DeepSpeed's ZeRO and FSDP2 do): right."""

    def gather(self):
        comm.all_gather(self.flat_param, self.shard.detach())


class Stage1InPlaceReduce(Stage1Right):
    """The output is this rank's own chunk of flat_grad, NCCL's in-place reduce-scatter: right."""

    def reduce(self, flat_grad):
        start = self.rank * self.chunk
        comm.reduce_scatter(flat_grad[start : start + self.chunk], flat_grad)
        return flat_grad[start : start + self.chunk] / self.world


class Stage1NoDetach(Stage1Right):
    def gather(self):
        comm.all_gather(self.flat_param, self.shard)  # a Parameter: autograd refuses


class Stage1GatherFromChunk0(Stage1Right):
    """The input is a view of the output's chunk 0 on every rank: in place on rank 0 only."""

    def gather(self):
        comm.all_gather(self.flat_param, self.flat_param[: self.chunk].detach())


class Stage1ReduceIntoChunk0(Stage1Right):
    """flat_grad's chunk 0 reused as the output: gloo copies the input first, so the values
    come out right on CPUs; NCCL overwrites chunk 0 while ranks 1.. still reduce it."""

    def reduce(self, flat_grad):
        comm.reduce_scatter(flat_grad[: self.chunk], flat_grad)
        return flat_grad[: self.chunk] / self.world


class Stage1Stub(Stage1Right):
    def step(self, flat_grad):
        raise NotImplementedError("exercise: replace this line with your code")


STAGE1_MISTAKES = [
    Mistake("right", (Stage1Right,), ""),
    Mistake("no divide", (Stage1NoDivide,), "forgot to divide by the world size N=3"),
    Mistake("no all-gather", (Stage1NoGather,), "forgot the all-gather"),
    Mistake("copy, no all-gather", (Stage1CopyNoGather,), "self.shard .* is a copy"),
    Mistake("full parameters", (Stage1Full,), "You stepped the full parameters"),
    Mistake(
        "all-reduce", (Stage1AllReduce,), r"the values are right, but the ledger shows \['all_r"
    ),
    Mistake("wrong shard", (Stage1WrongShard,), "self.shard is chunk 1 of flat_param"),
    Mistake("rebinds flat_param", (Stage1Rebinds,), "write into it in place"),
    Mistake("copy shard", (Stage1CopyShard,), "right values but is a copy.*must be a view"),
    Mistake("gather before step", (Stage1GatherBeforeStep,), "all-gather ran before self.optim"),
    Mistake("step before grad", (Stage1StepBeforeGrad,), "ran before self.shard.grad was set"),
    Mistake("divide twice", (Stage1DivideTwice,), "divided by N=3 twice"),
    Mistake("by N-1", (Stage1ByNMinus1,), "by N-1 = 2; divide by the world size N = 3"),
    Mistake("in-place all-gather", (Stage1InPlaceGather,), ""),
    Mistake("in-place reduce-scatter", (Stage1InPlaceReduce,), ""),
    Mistake(
        "all-gather from the Parameter",
        (Stage1NoDetach,),
        r"modified inplace.*Likely cause: .*Pass self.shard.detach\(\)",
        alone=True,
    ),
    Mistake(
        "all-gather input aliases chunk 0",
        (Stage1GatherFromChunk0,),
        r"rank [12]: .*comm.all_gather.*input shares memory with the output but is not this "
        r"rank's own chunk.*overlaps chunk 0.*Likely cause: one collective's input and output "
        r"overlap",
        alone=True,
    ),
    Mistake(
        "reduce-scatter output aliases chunk 0",
        (Stage1ReduceIntoChunk0,),
        r"rank [12]: .*comm.reduce_scatter.*output shares memory with the input but is not "
        r"this rank's own chunk.*Likely cause: one collective's input and output overlap",
        alone=True,
    ),
]
STAGE1_RIGHT = ("right", "in-place all-gather", "in-place reduce-scatter")


@pytest.fixture(scope="module")
def stage1_messages():
    return catalogue_messages(check_zero_stage1, STAGE1_MISTAKES)


@pytest.mark.parametrize("name", STAGE1_RIGHT)
def test_zero_stage1_passes(name, stage1_messages):
    assert stage1_messages[name] is None


@pytest.mark.parametrize(
    "mistake", [m for m in STAGE1_MISTAKES if m.name not in STAGE1_RIGHT], ids=lambda m: m.name
)
def test_zero_stage1_names_the_mistake(mistake, stage1_messages):
    assert names_mistake(mistake, stage1_messages[mistake.name]) is None


def test_zero_stage1_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_zero_stage1(Stage1Stub)
