"""The FSDP checkers pass right answers and name the mistake in wrong ones."""

import pytest
import torch
import torch.distributed as dist

from minidist import comm
from minidist.course.check import Mistake, catalogue_messages, names_mistake
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
    flat = torch.zeros(chunk * world_size, dtype=params[0].dtype)
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


def flatten_in_graph(params, rank, world_size):
    offsets, total = layout(params)
    chunk = -(-total // world_size)
    pad = torch.zeros(chunk * world_size - total, dtype=params[0].dtype)
    flat = torch.cat([p.reshape(-1) for p in params] + [pad])  # no detach: autograd records
    return flat[rank * chunk : (rank + 1) * chunk], offsets


def flatten_fp32(params, rank, world_size):
    offsets, total = layout(params)
    chunk = -(-total // world_size)
    flat = torch.zeros(chunk * world_size)  # float32 whatever the parameters are
    for p, off in zip(params, offsets):
        flat[off : off + p.numel()] = p.detach().reshape(-1)
    return flat[rank * chunk : (rank + 1) * chunk].clone(), offsets


def flatten_view(params, rank, world_size):
    offsets, total = layout(params)
    chunk = -(-total // world_size)
    flat = torch.zeros(chunk * world_size, dtype=params[0].dtype)
    for p, off in zip(params, offsets):
        flat[off : off + p.numel()] = p.detach().view(-1)  # refuses a transposed weight
    return flat[rank * chunk : (rank + 1) * chunk].clone(), offsets


def flatten_offsets_from_one(params, rank, world_size):
    chunk, offsets = flatten_right(params, rank, world_size)
    return chunk, [o + 1 for o in offsets]


def flatten_off_by_one_chunk(params, rank, world_size):
    offsets, total = layout(params)
    chunk = -(-total // world_size)
    flat = torch.zeros(chunk * world_size + 1, dtype=params[0].dtype)
    flat[:total] = torch.cat([p.detach().reshape(-1) for p in params])
    return flat[rank * chunk + 1 : (rank + 1) * chunk + 1].clone(), offsets


def flatten_forever(params, rank, world_size):
    total = 0
    while total < sum(p.numel() for p in params):
        total += 0  # never advances
    return flatten_right(params, rank, world_size)


def flatten_stub(params, rank, world_size):
    raise NotImplementedError("exercise: replace this line with your code")


FLAT_MISTAKES = [
    Mistake("right", (flatten_right,), ""),
    Mistake(
        "no padding", (flatten_no_padding,), "without padding .* Pad the flat buffer with zeros"
    ),
    Mistake("end offsets", (flatten_end_offsets,), "are where the parameters end"),
    Mistake("strided", (flatten_strided,), "every N-th element"),
    Mistake("reversed ranks", (flatten_reversed_ranks,), "returned the chunk of rank"),
    Mistake("garbage padding", (flatten_garbage_padding,), "pad with zeros"),
    Mistake("left in autograd", (flatten_in_graph,), "still in the parameters' autograd graph"),
    Mistake("bf16 widened", (flatten_fp32,), "chunk is float32 but the parameters are bfloat16"),
    Mistake("view on transposed", (flatten_view,), r"view size.*transposed.*reshape\(-1\)"),
    Mistake(
        "offsets from 1",
        (flatten_offsets_from_one,),
        r"offsets \[1\] are all 1 too large: an off-by-one",
    ),
    Mistake("chunk off by one", (flatten_off_by_one_chunk,), "rank 0 returned the chunk of rank 1"),
    Mistake("endless loop", (flatten_forever,), "still running after 5 s.*never ends"),
]


@pytest.fixture(scope="module")
def flat_messages():
    return catalogue_messages(check_flatten_and_shard, FLAT_MISTAKES)


def test_flatten_and_shard_passes(flat_messages):
    assert flat_messages["right"] is None


@pytest.mark.parametrize("mistake", FLAT_MISTAKES[1:], ids=lambda m: m.name)
def test_flatten_and_shard_names_the_mistake(mistake, flat_messages):
    assert names_mistake(mistake, flat_messages[mistake.name]) is None


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


def unshard_gather_and_copy(full, chunk, offsets, shapes):
    gathered = torch.empty(full.numel())  # a second full-size buffer
    comm.all_gather(gathered, chunk)
    full.untyped_storage().resize_(full.numel() * full.element_size())
    full.copy_(gathered)
    return views_of(full, offsets, shapes)


def unshard_stub(full, chunk, offsets, shapes):
    raise NotImplementedError("exercise: replace this line with your code")


UNSHARD_MISTAKES = [
    Mistake("right", (unshard_right, reshard_right), ""),
    Mistake("no resize", (unshard_no_resize, reshard_right), "no storage: `full` arrives freed"),
    Mistake("temporary", (unshard_temporary, reshard_right), "went into a temporary tensor"),
    Mistake("padding in view", (unshard_padding_in_view, reshard_right), "runs into the 1 element"),
    Mistake(
        "wrong offsets", (unshard_wrong_offsets, reshard_right), "wrong offsets: view 1 starts at"
    ),
    Mistake("all-reduce", (unshard_all_reduce, reshard_right), "all-gather .N-1./N·S"),
    Mistake("copies", (unshard_copies, reshard_right), "are copies, not views"),
    Mistake("new storage", (unshard_new_storage, reshard_right), "gathered into another storage"),
    Mistake("frees nothing", (unshard_right, reshard_nothing), "nothing was freed"),
    Mistake("replaces data", (unshard_right, reshard_replace), "you replaced the tensor's data"),
    Mistake(
        "gather and copy",
        (unshard_gather_and_copy, reshard_right),
        "temporary full-size buffer .* copied it into `full`",
    ),
]


@pytest.fixture(scope="module")
def unshard_messages():
    return catalogue_messages(check_unshard, UNSHARD_MISTAKES)


def test_unshard_passes(unshard_messages):
    assert unshard_messages["right"] is None


@pytest.mark.parametrize("mistake", UNSHARD_MISTAKES[1:], ids=lambda m: m.name)
def test_unshard_names_the_mistake(mistake, unshard_messages):
    assert names_mistake(mistake, unshard_messages[mistake.name]) is None


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


def reduce_n_minus_1(flat_grad):
    return reduce_right(flat_grad) * dist.get_world_size() / (dist.get_world_size() - 1)


def reduce_never_waited(flat_grad):
    world = dist.get_world_size()
    chunk = torch.empty(flat_grad.numel() // world)
    comm.reduce_scatter(chunk, flat_grad / world, async_op=True)  # the work is dropped
    return chunk


def reduce_rank0_only(flat_grad):
    if dist.get_rank() == 0:
        return reduce_right(flat_grad)
    return reduce_nothing(flat_grad)


def reduce_through_dist(flat_grad):
    world = dist.get_world_size()
    chunk = torch.empty(flat_grad.numel() // world)
    dist.reduce_scatter_tensor(chunk, flat_grad / world)
    return chunk


def reduce_stub(flat_grad):
    raise NotImplementedError("exercise: replace this line with your code")


REDUCE_MISTAKES = [
    Mistake("right", (reduce_right,), ""),
    Mistake("no divide", (reduce_no_divide,), "3x too large: the reduce-scatter sums"),
    Mistake("divide twice", (reduce_divide_twice,), "divided by N=3 twice"),
    Mistake("all-reduce", (reduce_all_reduce,), "twice the .* of a reduce-scatter"),
    Mistake("first chunk", (reduce_all_reduce_first_chunk,), "rank 1 got the chunk of rank 0"),
    Mistake("whole", (reduce_whole,), "the whole flat gradient"),
    Mistake("nothing", (reduce_nothing,), "nothing was reduced"),
    Mistake("by N-1", (reduce_n_minus_1,), "by N-1 = 2; divide by the world size N = 3"),
    Mistake("never waited", (reduce_never_waited,), "async reduce_scatter was never waited on"),
    Mistake(
        "rank 0 only", (reduce_rank0_only,), "inside a collective.*same collectives", alone=True
    ),
    Mistake("through dist", (reduce_through_dist,), r"ledger shows \[\].*minidist.comm"),
]


@pytest.fixture(scope="module")
def reduce_messages():
    return catalogue_messages(check_reduce_scatter_grad, REDUCE_MISTAKES)


def test_reduce_scatter_grad_passes(reduce_messages):
    assert reduce_messages["right"] is None


@pytest.mark.parametrize("mistake", REDUCE_MISTAKES[1:], ids=lambda m: m.name)
def test_reduce_scatter_grad_names_the_mistake(mistake, reduce_messages):
    assert names_mistake(mistake, reduce_messages[mistake.name]) is None


def test_reduce_scatter_grad_stub_is_not_implemented():
    with pytest.raises(NotImplementedError):
        check_reduce_scatter_grad(reduce_stub)
