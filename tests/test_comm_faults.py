"""Behaviours of minidist.comm that no other test pinned (issue 27): the aliasing check's
byte ranges, exact to the element, the all-to-all ledger for inputs of any rank, and which
devices each backend is checked to move."""

import math

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

import minidist
from minidist import backends, comm


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 40),
    st.integers(0, 40),
    st.integers(0, 40),
    st.integers(0, 40),
    st.sampled_from([torch.float32, torch.float64, torch.int8, torch.bfloat16]),
)
def test_overlap_is_exact_to_the_element(i, j, k, m, dtype):
    """Two slices of one buffer overlap iff their index ranges share an element."""
    x = torch.zeros(48, dtype=dtype)
    (a0, a1), (b0, b1) = sorted((i, j)), sorted((k, m))
    a, b = x[a0:a1], x[b0:b1]
    first, last = backends._byte_range(a)
    assert last - first == a.numel() * a.element_size()
    assert backends._overlap(a, b) == (a0 < b1 and b0 < a1 and a1 > a0 and b1 > b0)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(0, 5), st.integers(0, 5))
def test_a_strided_view_spans_from_its_first_to_its_last_element(rows, cols, r0, c0):
    x = torch.zeros(12, 12)
    view = x[r0 : r0 + rows, c0 : c0 + cols]
    first, last = backends._byte_range(view)
    end = view[-1, -1]
    assert (first, last) == (view.data_ptr(), end.data_ptr() + end.element_size())


TRAILING = [(), (3,), (2, 3), (4, 1, 2), (1, 5)]


def _uneven_all_to_all_any_rank():
    """Rank s sends 1 + s + 2d first-dimension entries to rank d, each of every trailing
    shape in TRAILING; what the ledger says it sent, and the truth."""
    rank, n = dist.get_rank(), dist.get_world_size()
    out = []
    for trailing in TRAILING:
        send = [1 + rank + 2 * d for d in range(n)]
        recv = [1 + s + 2 * rank for s in range(n)]
        inp = torch.randn(sum(send), *trailing)
        got = torch.empty(sum(recv), *trailing)
        with comm.record() as ledger:
            comm.all_to_all(got, inp, recv, send)
        (rec,) = ledger.records
        row = math.prod(trailing)
        out.append((rec.ring_bytes, float((sum(send) - send[rank]) * row * 4)))
    return out


def test_the_all_to_all_ledger_counts_every_trailing_dimension():
    for rank, pairs in enumerate(minidist.launch(_uneven_all_to_all_any_rank, 3)):
        for trailing, (recorded, sent) in zip(TRAILING, pairs):
            assert recorded == sent, (rank, trailing)


OPS = ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "send", "recv"]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(OPS), st.sampled_from(["gloo", "nccl"]), st.sampled_from(["cpu", "cuda"]))
def test_each_backend_is_checked_for_the_devices_it_moves(op, backend, kind):
    """Without a GPU: a stand-in tensor on `kind`; gloo moves CUDA tensors only in all-reduce
    and broadcast, NCCL only CUDA tensors."""
    from types import SimpleNamespace

    fake = SimpleNamespace(device=torch.device(kind, 0) if kind == "cuda" else torch.device(kind))
    ok = kind == "cuda" if backend == "nccl" else kind == "cpu" or op in ("all_reduce", "broadcast")
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(backends, "group_backend", lambda group=None: backend)
        if ok:
            backends._check_devices(op, [fake], None, "t")
        else:
            with pytest.raises(ValueError, match=f"comm.{op}: the tensor tagged 't' is on {kind}"):
                backends._check_devices(op, [fake], None, "t")
    finally:
        mp.undo()
