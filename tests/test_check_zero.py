"""The ZeRO checkers pass right answers and name the mistake in wrong ones."""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from minidist import comm
from minidist.course.check import CheckFailed
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


def shard_stub(tensor, rank, world_size):
    raise NotImplementedError("exercise: replace this line with your code")


def test_shard_with_padding_passes(capsys):
    check_shard_with_padding(shard_right)
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize(
    "impl, hint",
    [
        (shard_no_padding, r"chunks have \[2, 1\] elements: without padding"),
        (shard_torch_chunk, "torch.chunk"),
        (shard_floor, "belong to no rank"),
        (shard_wrong_index, "rank 0 returned chunk 1"),
        (shard_pad_with_ones, r"padding holds \[1.0\] instead of zeros"),
        (shard_strided, "strided split"),
        (shard_pad_in_front, "padding went in front"),
        (shard_always_pads, "already divides by 2: pad"),
        (shard_keeps_a_dimension, "flatten first"),
    ],
)
def test_shard_with_padding_names_the_mistake(impl, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_shard_with_padding(impl)


def test_shard_with_padding_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_shard_with_padding(shard_stub)


# -- exercise 2: reduce_scatter_bucket --------------------------------------------------------


def rs_right(flat_grad):
    world = dist.get_world_size()
    out = torch.empty(flat_grad.numel() // world)
    comm.reduce_scatter(out, flat_grad)
    return out.div_(world)


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


def rs_stub(flat_grad):
    raise NotImplementedError("exercise: replace this line with your code")


def test_reduce_scatter_bucket_passes(capsys):
    check_reduce_scatter_bucket(rs_right)
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize(
    "impl, hint",
    [
        (rs_no_divide, "forgot to divide by the world size N=2"),
        (rs_divide_twice, "divided by N=2 twice"),
        (rs_all_reduce, r"ledger shows \['all_reduce'\].*twice the reduce-scatter's"),
        (rs_all_reduce_wrong_chunk, "rank 0 holds chunk 1's mean"),
        (rs_all_reduce_whole, "returned the whole bucket .* An all-reduce"),
        (rs_output_too_big, "output must hold 1/N of its input"),
        (rs_own_chunk, "still holds its own gradient"),
        (rs_twice, "call it once"),
    ],
)
def test_reduce_scatter_bucket_names_the_mistake(impl, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_reduce_scatter_bucket(impl)


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


class Stage1Stub(Stage1Right):
    def step(self, flat_grad):
        raise NotImplementedError("exercise: replace this line with your code")


def test_zero_stage1_passes(capsys):
    check_zero_stage1(Stage1Right)
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize(
    "impl, hint",
    [
        (Stage1NoDivide, "forgot to divide by the world size N=2"),
        (Stage1NoGather, "forgot the all-gather"),
        (Stage1CopyNoGather, "flat_param did not change at all"),
        (Stage1Full, "You stepped the full parameters"),
        (Stage1AllReduce, r"the values are right, but the ledger shows \['all_reduce'"),
        (Stage1WrongShard, "self.shard is chunk 1 of flat_param"),
        (Stage1Rebinds, "write into it in place"),
    ],
)
def test_zero_stage1_names_the_mistake(impl, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_zero_stage1(impl)


def test_zero_stage1_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_zero_stage1(Stage1Stub)
