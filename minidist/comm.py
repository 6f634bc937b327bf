"""The one door to torch.distributed: every collective and p2p call minidist makes.

Each function here calls the `torch.distributed` op of the same name and, while a
`record()` context is open on this rank, appends a `CommRecord` to its `Ledger`: the op,
the group's size and ranks, the payload in bytes, and the bytes this rank sends on a ring
(the "bus bandwidth" factors of NCCL-tests, doc/PERFORMANCE.md):

    all-reduce 2(N-1)/N·S      reduce-scatter, all-gather, all-to-all (N-1)/N·S
    broadcast, reduce S        send S (the receiver records S received, 0 sent)

where S is the size of the full tensor (the all-gather output, the reduce-scatter input).
Records also carry start and end times (an async op ends when its future completes), which
is what the data-parallel timeline draws. The records and `record()` live in
`minidist/ledger.py`; every name is importable from here.

Devices: NCCL moves only CUDA tensors; gloo moves CPU tensors (and CUDA ones only in
all-reduce and broadcast). A tensor the group's backend cannot move is refused here, naming
the op, the tensor's tag, its device and the backend, before the backend sees it.
`group_device(group)` is where a small bookkeeping tensor for that group must live.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import cloudpickle
import torch
import torch.distributed as dist

from .backends import (  # noqa: F401
    _NO_PAYLOAD,
    _check_aliasing,
    _check_devices,
    group_backend,
    group_device,
)
from .ledger import (  # noqa: F401 (minidist.comm's names since lesson 00)
    RING_FACTORS,
    CommRecord,
    Ledger,
    _active_ledgers,
    record,
    ring_bytes,
    unrecorded,
)
from .runtime.host import dumps_on_host

ReduceOp = dist.ReduceOp

# torch 2.13 renamed the flat-tensor collectives; older releases only have the old names.
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

# On a rank that `minidist.launch` started: its slot of the world's call board
# (`runtime/board.py`), where the call this rank is inside is written for the parent to read
# when the world hangs.
_board = None


# Groups `new_group` made, by (purpose, ranks), and the world they were made in.
_groups: dict[tuple[str, tuple[int, ...]], object] = {}
_groups_world = None


def new_group(ranks: Sequence[int], purpose: str = ""):
    """`dist.new_group(ranks)`, made once per world and purpose: a layout built after another
    in the same world (a test's, a sweep's, the trainer's evaluation) takes the groups the
    first made, instead of opening new connections and backend threads for each of its
    dozens of groups. As with `dist.new_group`, every rank calls it for every group, in the
    same order. `purpose` keeps apart groups of the same ranks that carry different streams
    of collectives (a grid's dp_shard and its ep over the same ranks), as separate
    `dist.new_group` calls did. A group made here must not be destroyed."""
    global _groups_world
    world = dist.group.WORLD
    if _groups_world is not world:  # a new world in this process: the old groups are gone
        _groups.clear()
        _groups_world = world
    key = (purpose, tuple(sorted(ranks)))
    if key not in _groups:
        _groups[key] = dist.new_group(list(ranks))
    return _groups[key]


def _group_ranks(group) -> tuple[int, ...]:
    if group is None or group is dist.group.WORLD:
        return tuple(range(dist.get_world_size()))
    return tuple(dist.get_process_group_ranks(group))


def _log(op: str, tensor, group, tag: str = "") -> CommRecord | None:
    """Append a record to the open ledgers (the caller stamps its end time); `tensor` may be
    a list of tensors (torch's list form), whose sizes add up."""
    if not _active_ledgers:
        return None
    ranks = _group_ranks(group)
    parts = list(tensor) if isinstance(tensor, list | tuple) else [tensor]
    payload = sum(t.numel() * t.element_size() for t in parts)
    tensor = parts[0] if parts else _NO_PAYLOAD
    rec = CommRecord(
        op,
        len(ranks),
        ranks,
        payload,
        ring_bytes(op, payload, len(ranks)),
        tensor.dtype,
        start=time.perf_counter(),
        tag=tag,
    )
    if op == "send" and any(ledger.keep_sent for ledger in _active_ledgers):
        rec.sent = tensor.detach().clone()
    for ledger in _active_ledgers:
        ledger.records.append(rec)
    return rec


def _run(op: str, tensor: torch.Tensor, group, async_op: bool, call, tag="", others=()):
    if tensor is not _NO_PAYLOAD:
        _check_devices(op, (tensor, *others), group, tag)
    if op in ("all_gather", "reduce_scatter"):  # tensor: the whole; others: (the part,)
        _check_aliasing(op, tensor, others[0], group, tag)
    rec = _log(op, tensor, group, tag=tag)
    work = _on_board(op, tag, group, call, async_op)
    return _stamp_end(rec, work if async_op else None) or work


def _on_board(op: str, tag: str, group, call, async_op: bool = False):
    """`call()`, with this rank's call board saying it is inside `op` meanwhile (and, for an
    asynchronous op, that its work may still be pending after)."""
    if _board is None:
        return call()
    _board.enter(op, tag, dist.get_world_size(group))
    try:
        return call()
    finally:
        _board.leave(async_op)


class _StampOnWait:
    """An async work whose backend has no future (gloo's reduce-scatter): the end is stamped
    when `wait()` returns, an upper bound of when the collective finished."""

    def __init__(self, work, rec: CommRecord):
        self._work, self._rec = work, rec

    def wait(self, *args):
        done = self._work.wait(*args)
        if self._rec.end is None:
            self._rec.end = time.perf_counter()
        return done

    def __getattr__(self, name):
        return getattr(self._work, name)


def _stamp_end(rec: CommRecord | None, work):
    """Stamp the end now (blocking call) or when the async work completes; returns a
    replacement for `work` when its completion can only be seen at `wait()`."""
    if rec is None:
        return None
    if work is None:
        rec.end = time.perf_counter()
        return None
    try:
        future = work.get_future()
    except RuntimeError:  # "Work::getFuture not implemented"
        return _StampOnWait(work, rec)
    future.then(lambda fut: setattr(rec, "end", time.perf_counter()))
    return None


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False, tag=""):
    return _run(
        "all_reduce",
        tensor,
        group,
        async_op,
        lambda: dist.all_reduce(tensor, op=op, group=group, async_op=async_op),
        tag,
    )


def reduce_scatter(output, input, op=ReduceOp.SUM, group=None, async_op=False, tag=""):
    """`output` (1/N of `input`) receives this rank's reduced chunk of `input`; `output` may
    be that chunk of `input` itself (in place), and share no other memory with it."""
    return _run(
        "reduce_scatter",
        input,
        group,
        async_op,
        lambda: _reduce_scatter_flat(output, input, op=op, group=group, async_op=async_op),
        tag,
        (output,),
    )


def all_gather(output, input, group=None, async_op=False, tag=""):
    """`output` (N times `input`) receives every rank's `input`, in rank order; or, in
    torch.distributed's list form, `output[r]` receives rank r's `input`. `input` may be
    this rank's own chunk of `output` (in place), and share no other memory with it."""
    gather = dist.all_gather if isinstance(output, list | tuple) else _all_gather_flat
    return _run(
        "all_gather",
        output,
        group,
        async_op,
        lambda: gather(output, input, group=group, async_op=async_op),
        tag,
        (input,),
    )


def broadcast(tensor, src, group=None, async_op=False, tag=""):
    return _run(
        "broadcast",
        tensor,
        group,
        async_op,
        lambda: dist.broadcast(tensor, src=src, group=group, async_op=async_op),
        tag,
    )


def reduce(tensor, dst, op=ReduceOp.SUM, group=None, async_op=False, tag=""):
    return _run(
        "reduce",
        tensor,
        group,
        async_op,
        lambda: dist.reduce(tensor, dst=dst, op=op, group=group, async_op=async_op),
        tag,
    )


def all_to_all(
    output,
    input,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group=None,
    async_op=False,
    tag="",
):
    """Rank i's j-th input chunk lands as rank j's i-th output chunk."""
    _check_devices("all_to_all", (output, input), group, tag)
    _check_aliasing("all_to_all", output, input, group, tag)
    rec = _log("all_to_all", input, group, tag=tag)
    if rec is not None and rec.group_size > 1:
        # The (N-1)/N factor assumes even chunks; record what this rank really sends instead.
        if input_split_sizes is None:
            own = input.numel() // rec.group_size
        else:
            row = math.prod(input.shape[1:])  # elements per first-dimension entry
            own = input_split_sizes[dist.get_rank(group)] * row
        rec.ring_bytes = float((input.numel() - own) * input.element_size())
    work = _on_board(
        "all_to_all",
        tag,
        group,
        lambda: dist.all_to_all_single(
            output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op
        ),
        async_op,
    )
    return _stamp_end(rec, work if async_op else None) or work


def barrier(group=None, tag=""):
    """Wait until every rank of `group` arrives (recorded with no payload)."""
    return _run("barrier", _NO_PAYLOAD, group, False, lambda: dist.barrier(group=group), tag)


def all_gather_object(output: list, obj, group=None, tag=""):
    """`output[r]` receives rank r's picklable `obj` (recorded without a byte count: the
    pickled size is not known before; used for checks, not for training traffic). Pickled
    as a rank's result is (`dumps_on_host`: CPU tensors, their bytes sent as they are)."""
    pickled = [None] * len(output)
    _run(
        "all_gather_object",
        _NO_PAYLOAD,
        group,
        False,
        lambda: dist.all_gather_object(pickled, dumps_on_host(obj), group=group),
        tag,
    )
    # Bytes from this world's own ranks over its process group, never from a file (as torch's
    # all_gather_object, which unpickles them too): checkpoints are read by checkpoint_safe.
    output[:] = [cloudpickle.loads(p) for p in pickled]


def send(tensor, dst, group=None, tag=""):
    return _run("send", tensor, group, False, lambda: dist.send(tensor, dst, group=group), tag)


def recv(tensor, src, group=None, tag=""):
    return _run("recv", tensor, group, False, lambda: dist.recv(tensor, src, group=group), tag)


def batch_isend_irecv(ops: list[tuple], group=None, tag="") -> list:
    """Post several sends/receives at once: `ops` is [("send"|"recv", tensor, peer), ...],
    each optionally with a fourth element, the message tag (an int: messages between the
    same two ranks are matched in order per tag, so separate streams need separate tags).

    Returns the works to wait on. Posting both directions together is what keeps a ring or a
    pipeline from deadlocking when every rank sends before it receives.
    """
    ranks = _group_ranks(group)
    for kind, tensor, peer, *_ in ops:  # every op checked before any is posted or recorded
        if kind not in ("send", "recv"):
            raise ValueError(f"batch_isend_irecv: op kind must be 'send' or 'recv', got {kind!r}")
        if peer not in ranks:
            raise ValueError(f"batch_isend_irecv: peer={peer} of a {kind} is not in {ranks}")
        _check_devices(f"batch_isend_irecv ({kind})", (tensor,), group, tag)
    p2p = []
    for kind, tensor, peer, *message_tag in ops:
        fn = dist.isend if kind == "send" else dist.irecv
        p2p.append(
            dist.P2POp(fn, tensor, peer, group=group, tag=message_tag[0] if message_tag else 0)
        )
        _stamp_end(_log(kind, tensor, group, tag=tag), None)
    return _on_board("batch_isend_irecv", tag, group, lambda: dist.batch_isend_irecv(p2p), True)
