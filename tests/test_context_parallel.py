"""Context parallelism (lesson 15): ring attention equals torch's attention, the
context-parallel GPT equals the dense GPT, and bytes, memory and work equal the theory
(Liu et al. 2023, "Ring Attention", section 3)."""

from collections import Counter

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import minidist
from minidist import comm
from minidist.context_parallel import ContextParallelGPT, theory
from minidist.context_parallel.fixture import attention_rank, layer_activations_rank, train_on_rank
from minidist.context_parallel.ring import ring_attention, work_per_forward
from minidist.context_parallel.split import positions
from minidist.context_parallel.timeline import ring_timeline_rank
from minidist.megatron.fixture import STEPS, build_dense, compare, matches, reference

# Tolerances: ring attention in float64 against torch's attention agrees to 1e-12 (the same
# sums in another order); the GPT in float32 within lesson 07's (the fixture's) tolerances.


def _attention_rank(layout, seqs):
    """On a rank: `attention_rank` for each sequence length, with the chunk pairs computed."""
    work_per_forward()
    return [(*attention_rank(layout, 2, 4, seq, 8), work_per_forward()) for seq in seqs]


@pytest.mark.parametrize("c", [2, 3, 4])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_ring_attention_equals_torch_attention_and_saves_one_c_th(c, layout):
    chunks = c if layout == "contiguous" else 2 * c
    seqs = [24 if c == 3 else 16, chunks, 3 * chunks]  # chunks of 1 and 3 tokens too
    for rank, results in enumerate(minidist.launch(_attention_rank, c, layout, seqs)):
        for worst, saved, saved_whole, work in results:
            assert worst < 1e-12
            assert saved * c == saved_whole  # q, k, v, output, log-sum-exp: 1/c of each
            assert work == [theory.causal_pairs(layout, c)[rank]]


def _subgroup_rank(layout):
    """On a rank of 4: two interleaved rings, {0, 2} and {1, 3} (context-parallel groups
    inside data parallelism), each with its own q, k, v; this rank's largest difference
    from torch's attention, output and gradients."""
    rank = dist.get_rank()
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    group = groups[rank % 2]
    g = torch.Generator().manual_seed(rank % 2)
    q, k, v, up = (torch.randn(2, 2, 8, 4, generator=g, dtype=torch.float64) for _ in "qkvu")
    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*whole, is_causal=True)
    want.backward(up)
    pos = positions(8, 2, dist.get_rank(group), layout)
    mine = [t[:, :, pos].clone().requires_grad_() for t in (q, k, v)]
    out = ring_attention(*mine, group, layout)
    out.backward(up[:, :, pos])
    diffs = [(m.grad - w.grad[:, :, pos]).abs().max() for m, w in zip(mine, whole)]
    return float(max((out - want[:, :, pos]).detach().abs().max(), *diffs))


def test_ring_attention_runs_on_rings_that_are_subgroups_of_the_world():
    assert max(minidist.launch(_subgroup_rank, 4, "zigzag")) < 1e-12


@pytest.mark.parametrize("c", [2, 3])
def test_each_block_transfer_is_posted_before_its_computation_and_waited_after(c):
    """The overlap of section 3: step i's K/V transfer starts before step i's computation
    and ends after it; the dK, dV accumulator (not overlapped) leaves after the computation."""
    for t in minidist.launch(ring_timeline_rank, c, "zigzag", 1, 2, 8 * c, 4):
        compute = t.spans(transfers=False)
        kinds = Counter(what for what, _, _ in t.events)
        assert kinds == {
            "compute": 2 * c,
            "cp-kv-forward": c - 1,
            "cp-kv-backward": c - 1,
            "cp-dkv-backward": c,
        }
        kv = [(s, e) for what, s, e in t.events if what.startswith("cp-kv")]
        steps = compute[: c - 1] + compute[c : 2 * c - 1]  # steps that hand a block on
        for (s, e), (cs, ce) in zip(kv, steps, strict=True):
            assert s <= cs and e >= ce
        dkv = [(s, e) for what, s, e in t.events if what == "cp-dkv-backward"]
        assert all(s >= ce for (s, _), (_, ce) in zip(dkv, compute[c:], strict=True))
        assert 0.0 <= t.overlap <= 1.0


@pytest.fixture(scope="module")
def ref():
    return reference()


@pytest.mark.parametrize("c", [2, 4])
def test_context_parallel_gpt_equals_the_dense_gpt_and_its_bytes_the_theory(c, ref):
    model, batches, _ = build_dense()
    cfg = model.cfg
    b, s = batches[0][0].shape
    for layout in ("zigzag", "contiguous"):
        runs = minidist.launch(train_on_rank, c, layout)
        for run in runs:
            assert matches(compare(run.trace, ref)), compare(run.trace, ref)
        sent = sum(r.ring_bytes for r in runs[0].records) / STEPS
        assert sent == pytest.approx(
            theory.bytes_sent_per_step(cfg.layers, b, s, cfg.hidden, c, runs[0].trainable)
        )
        forward = sum(r.ring_bytes for r in runs[0].records if r.tag == "cp-kv-forward")
        per_layer = forward / STEPS / cfg.layers
        assert per_layer == (c - 1) / c * theory.kv_bytes(b, s, cfg.hidden)
        per_tag = Counter()
        for r in runs[0].records:
            per_tag[r.tag] += r.ring_bytes / STEPS
        # each collective under its own tag, as the theory's phases
        phases = theory.ring_bytes_per_layer(b, s, cfg.hidden, c)
        assert dict(per_tag) == pytest.approx(
            {
                "cp-kv-forward": cfg.layers * phases["forward"],
                "cp-kv-backward": cfg.layers * phases["backward K, V"],
                "cp-dkv-backward": cfg.layers * phases["backward dK, dV"],
                "cp-grads": comm.ring_bytes("all_reduce", 4 * runs[0].trainable, c),
                "cp-loss": comm.ring_bytes("all_reduce", 4, c),
            }
        )
        # causal work: chunk pairs per forward on each rank
        assert [run.work[0] for run in runs] == theory.causal_pairs(layout, c)


@pytest.mark.parametrize("c", [1, 2, 4])
def test_a_layer_saves_one_c_th_of_the_dense_activations(c):
    dense = minidist.launch(layer_activations_rank, 1)[0]
    assert all(a * c == dense for a in minidist.launch(layer_activations_rank, c))


@pytest.mark.parametrize("c", [1, 2, 3, 5, 8])
def test_the_splits_cover_the_sequence_once_and_zigzag_balances_the_work(c):
    seq = 4 * c
    for layout in ("zigzag", "contiguous"):
        held = torch.cat([positions(seq, c, r, layout) for r in range(c)])
        assert sorted(held.tolist()) == list(range(seq))
    assert theory.imbalance("zigzag", c) == 1.0
    assert theory.imbalance("contiguous", c) == pytest.approx(2 * c / (c + 1))
    # the pairs computed are exactly those not masked whole
    size = seq // (2 * c)
    for r in range(c):
        chunks = [r, 2 * c - 1 - r]
        pairs = sum(1 for qi in chunks for kj in range(2 * c) if kj * size <= (qi + 1) * size - 1)
        assert pairs == theory.causal_pairs("zigzag", c)[r]


@settings(max_examples=80, deadline=None)
@given(
    c=st.integers(1, 8), size=st.integers(1, 4), layout=st.sampled_from(["zigzag", "contiguous"])
)
def test_causal_work_counts_the_scores_of_every_chunk_pair_not_masked_whole(c, size, layout):
    seq = size * (c if layout == "contiguous" else 2 * c)
    every = [positions(seq, c, r, layout).split(size) for r in range(c)]
    keys = [k for chunks in every for k in chunks]
    want = [
        sum(size * size for q in chunks for k in keys if int(k.min()) <= int(q.max()))
        for chunks in every
    ]
    assert theory.causal_work(layout, seq, c) == want


def _refused(seq_len, layout, dropout=0.0):
    model = build_dense(seq_len=seq_len, dropout=dropout).model
    try:
        ContextParallelGPT(model, None, layout)
    except ValueError as e:
        return str(e)


def test_bad_splits_and_dropout_are_refused_by_name():
    assert "not divisible by 8" in minidist.launch(_refused, 4, 12, "zigzag")[0]
    assert "layout must be one of" in minidist.launch(_refused, 2, 16, "striped")[0]
    assert "dropout=0.1" in minidist.launch(_refused, 2, 16, "zigzag", 0.1)[0]
