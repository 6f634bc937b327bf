"""Lessons 14 and 15 under bad input: refused by name on every rank before any collective,
never an IndexError on some ranks and a lost peer or a gloo abort on the others (issue 27)."""

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

import minidist
from minidist.context_parallel import ring_attention, theory
from minidist.megatron.model import TensorParallelGPT
from minidist.models import GPT, GPTConfig

CFG = dict(vocab_size=16, seq_len=8, layers=1, heads=2, hidden=8)


def _too_long(sequence_parallel, seq):
    torch.manual_seed(0)
    tp = TensorParallelGPT(GPT(GPTConfig(**CFG)), sequence_parallel=sequence_parallel)
    try:
        tp(torch.zeros(2, seq, dtype=torch.long))
    except ValueError as exc:
        return str(exc)
    return "accepted"


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_a_sequence_longer_than_seq_len_is_refused_on_every_rank(sequence_parallel):
    texts = minidist.launch(_too_long, 2, sequence_parallel, 10, timeout_s=120)
    assert len(set(texts)) == 1 and "seq <= cfg.seq_len=8" in texts[0], texts


def _ring(case):
    rank = dist.get_rank()
    q = torch.randn(1, 2, 4, 4, dtype=torch.float64)
    k, v = q.clone(), q.clone()
    if case == "dtype":
        k = k.float()
    elif case == "length":
        v = v[:, :, :3]
    elif case == "ranks":  # rank 1 holds fewer positions than rank 0
        q, k, v = (t[:, :, : 4 - 2 * rank] for t in (q, k, v))
    try:
        ring_attention(q, k, v)
    except ValueError as exc:
        return str(exc)
    return "accepted"


@pytest.mark.parametrize(
    "case, want",
    [
        ("dtype", "k (1, 2, 4, 4) torch.float32 on cpu differs from q"),
        ("length", "v (1, 2, 3, 4) torch.float64 on cpu differs from q"),
        ("ranks", "the ranks hold different numbers of positions [4, 2]"),
    ],
)
def test_ring_attention_refuses_mismatched_inputs_on_every_rank(case, want):
    texts = minidist.launch(_ring, 2, case, timeout_s=120)
    assert len(set(texts)) == 1 and want in texts[0], texts


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 8), st.integers(1, 512), st.integers(1, 256), st.integers(1, 8))
def test_one_rank_sends_no_bytes_and_c_ranks_send_the_ring(batch, seq, hidden, layers):
    one = theory.ring_bytes_per_layer(batch, seq, hidden, 1)
    assert one == {"forward": 0.0, "backward K, V": 0.0, "backward dK, dV": 0.0}
    assert theory.bytes_sent_per_step(layers, batch, seq, hidden, 1, 1000) == 0.0
    whole = theory.kv_bytes(batch, seq, hidden)
    for c in (2, 3, 8):
        got = theory.ring_bytes_per_layer(batch, seq, hidden, c)
        assert got["backward dK, dV"] == whole and got["forward"] == (c - 1) * whole / c
