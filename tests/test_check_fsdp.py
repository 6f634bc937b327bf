"""The FSDP checkers pass right answers and name the mistake in wrong ones."""

import pytest
import torch
import torch.distributed as dist

from minidist import comm
from minidist.course.check import CheckFailed
from minidist.fsdp.check import check_flatten_and_shard, check_reduce_scatter_grad, check_unshard

# -- exercise 1: flatten_and_shard ----------------------------------------------------------


def layout(params):
    offsets, offset = [], 0
    for p in params:
        offsets.append(offset)
        offset += p.numel()
    return offsets, offset


def flatten_right(params, rank, world_size):
    offsets, total = layout(params)
    chunk = -(-total // world_size)
    flat = torch.zeros(chunk * world_size)
    for p, off in zip(params, offsets):
        flat[off : off + p.numel()] = p.detach().reshape(-1)
    return flat[rank * chunk : (rank + 1) * chunk].clone(), offsets


def flatten_no_padding(params, rank, world_size):
    offsets, total = layout(params)
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    chunk = total // world_size
    return flat[rank * chunk : (rank + 1) * chunk].clone(), offsets


def flatten_end_offsets(params, rank, world_size):
    chunk, offsets = flatten_right(params, rank, world_size)
    return chunk, [o + p.numel() for o, p in zip(offsets, params)]


def flatten_strided(params, rank, world_size):
    offsets, total = layout(params)
    chunk = -(-total // world_size)
    flat = torch.zeros(chunk * world_size)
    flat[:total] = torch.cat([p.detach().reshape(-1) for p in params])
    return flat[rank::world_size].clone(), offsets


def flatten_reversed_ranks(params, rank, world_size):
    return flatten_right(params, world_size - 1 - rank, world_size)


def flatten_garbage_padding(params, rank, world_size):
    offsets, total = layout(params)
    chunk = -(-total // world_size)
    flat = torch.full((chunk * world_size,), -7.0)  # stands for torch.empty's leftovers
    flat[:total] = torch.cat([p.detach().reshape(-1) for p in params])
    return flat[rank * chunk : (rank + 1) * chunk].clone(), offsets


def flatten_stub(params, rank, world_size):
    raise NotImplementedError("exercise: replace this line with your code")


def test_flatten_and_shard_passes(capsys):
    check_flatten_and_shard(flatten_right)
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize(
    "impl, hint",
    [
        (flatten_no_padding, "without padding .* Pad the flat buffer with zeros"),
        (flatten_end_offsets, "are where the parameters end"),
        (flatten_strided, "every N-th element"),
        (flatten_reversed_ranks, "returned the chunk of rank"),
        (flatten_garbage_padding, "pad with zeros"),
    ],
)
def test_flatten_and_shard_names_the_mistake(impl, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_flatten_and_shard(impl)


def test_flatten_and_shard_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_flatten_and_shard(flatten_stub)


# -- exercise 2: unshard / reshard ------------------------------------------------------------


def views_of(flat, offsets, shapes):
    return [flat[off : off + s.numel()].view(s) for off, s in zip(offsets, shapes)]


def unshard_right(full, chunk, offsets, shapes):
    full.untyped_storage().resize_(full.numel() * full.element_size())
    comm.all_gather(full, chunk)
    return views_of(full, offsets, shapes)


def reshard_right(full):
    full.untyped_storage().resize_(0)


def unshard_no_resize(full, chunk, offsets, shapes):
    comm.all_gather(full, chunk)
    return views_of(full, offsets, shapes)


def unshard_temporary(full, chunk, offsets, shapes):
    flat = torch.empty(full.numel())
    comm.all_gather(flat, chunk)
    return views_of(flat, offsets, shapes)


def unshard_padding_in_view(full, chunk, offsets, shapes):
    views = unshard_right(full, chunk, offsets, shapes)
    views[-1] = full[offsets[-1] :]  # the last parameter runs to the end of the buffer
    return views


def unshard_wrong_offsets(full, chunk, offsets, shapes):
    unshard_right(full, chunk, offsets, shapes)
    return [full[i : i + s.numel()].view(s) for i, s in enumerate(shapes)]


def unshard_all_reduce(full, chunk, offsets, shapes):
    full.untyped_storage().resize_(full.numel() * full.element_size())
    full.zero_()
    rank = dist.get_rank()
    full[rank * chunk.numel() : (rank + 1) * chunk.numel()] = chunk
    comm.all_reduce(full)
    return views_of(full, offsets, shapes)


def unshard_copies(full, chunk, offsets, shapes):
    return [v.clone() for v in unshard_right(full, chunk, offsets, shapes)]


def unshard_new_storage(full, chunk, offsets, shapes):
    full.data = torch.empty(full.numel())  # a new storage each time
    comm.all_gather(full, chunk)
    return views_of(full, offsets, shapes)


def reshard_nothing(full):
    del full  # drops a name; the storage stays


def reshard_replace(full):
    full.data = torch.empty(0)


def unshard_stub(full, chunk, offsets, shapes):
    raise NotImplementedError("exercise: replace this line with your code")


def test_unshard_passes(capsys):
    check_unshard(unshard_right, reshard_right)
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize(
    "unshard, reshard, hint",
    [
        (unshard_no_resize, reshard_right, "no storage: `full` arrives freed"),
        (unshard_temporary, reshard_right, "went into a temporary tensor"),
        (unshard_padding_in_view, reshard_right, "runs into the 1 element.s. of padding"),
        (unshard_wrong_offsets, reshard_right, "wrong offsets: view 1 starts at flat element 1,"),
        (unshard_all_reduce, reshard_right, "all-gather .N-1./N·S"),
        (unshard_copies, reshard_right, "are copies, not views"),
        (unshard_new_storage, reshard_right, "gathered into another storage"),
        (unshard_right, reshard_nothing, "nothing was freed"),
        (unshard_right, reshard_replace, "you replaced the tensor's data"),
    ],
)
def test_unshard_names_the_mistake(unshard, reshard, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_unshard(unshard, reshard)


def test_unshard_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_unshard(unshard_stub, reshard_right)


# -- exercise 3: reduce_scatter_grad -----------------------------------------------------------


def reduce_right(flat_grad):
    world = dist.get_world_size()
    chunk = torch.empty(flat_grad.numel() // world)
    comm.reduce_scatter(chunk, flat_grad / world)
    return chunk


def reduce_no_divide(flat_grad):
    chunk = torch.empty(flat_grad.numel() // dist.get_world_size())
    comm.reduce_scatter(chunk, flat_grad)
    return chunk


def reduce_divide_twice(flat_grad):
    return reduce_right(flat_grad) / dist.get_world_size()


def reduce_all_reduce(flat_grad):
    world, rank = dist.get_world_size(), dist.get_rank()
    comm.all_reduce(flat_grad)
    flat_grad /= world
    c = flat_grad.numel() // world
    return flat_grad[rank * c : (rank + 1) * c]


def reduce_all_reduce_first_chunk(flat_grad):
    world = dist.get_world_size()
    comm.all_reduce(flat_grad)
    return flat_grad[: flat_grad.numel() // world] / world


def reduce_whole(flat_grad):
    comm.all_reduce(flat_grad)
    return flat_grad / dist.get_world_size()


def reduce_nothing(flat_grad):
    rank, c = dist.get_rank(), flat_grad.numel() // dist.get_world_size()
    return flat_grad[rank * c : (rank + 1) * c]


def reduce_stub(flat_grad):
    raise NotImplementedError("exercise: replace this line with your code")


def test_reduce_scatter_grad_passes(capsys):
    check_reduce_scatter_grad(reduce_right)
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize(
    "impl, hint",
    [
        (reduce_no_divide, "2x too large: the reduce-scatter sums"),
        (reduce_divide_twice, "divided by N=2 twice"),
        (reduce_all_reduce, "twice the .* of a reduce-scatter"),
        (reduce_all_reduce_first_chunk, "rank 1 got the chunk of rank 0"),
        (reduce_whole, "the whole flat gradient"),
        (reduce_nothing, "nothing was reduced"),
    ],
)
def test_reduce_scatter_grad_names_the_mistake(impl, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_reduce_scatter_grad(impl)


def test_reduce_scatter_grad_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_reduce_scatter_grad(reduce_stub)
