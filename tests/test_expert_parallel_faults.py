"""Lesson 16 under bad input: arguments refused by name before anything runs, a NaN token
refused instead of shifting the finite tokens' routing, an empty batch's aux loss 0, and
groups that do not form a grid refused on every rank (issue 27)."""

import math

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

import minidist
from minidist.expert_parallel.moe import MoE
from minidist.expert_parallel.parallel import ExpertParallelMoE
from minidist.expert_parallel.routing import route


@pytest.mark.parametrize(
    "kwargs, rule",
    [
        (dict(k=2.0), "ints 1 <= k=2.0"),
        (dict(k=True), "ints 1 <= k=True"),
        (dict(k=0), "1 <= k=0"),
        (dict(capacity_factor=math.nan), "capacity_factor=nan must be a finite number > 0"),
        (dict(capacity_factor=math.inf), "capacity_factor=inf must be a finite number > 0"),
        (dict(capacity_factor=0.0), "capacity_factor=0.0 must be a finite number > 0"),
        (dict(capacity_factor="1"), "capacity_factor='1' must be"),
    ],
)
def test_bad_moe_arguments_are_refused_by_name(kwargs, rule):
    with pytest.raises(ValueError, match=f"MoE: .*{rule}".replace("(", r"\(").replace("+", r"\+")):
        MoE(8, 16, 4, **kwargs)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(2, 24),
    st.integers(1, 3),
    st.floats(0.25, 2.0),
    st.integers(0, 10**6),
    st.sampled_from([math.nan, math.inf, -math.inf]),
)
def test_a_non_finite_token_is_refused_and_names_the_token(tokens, k, cf, seed, bad):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, 4, generator=g)
    where = seed % tokens
    logits[where, seed % 4] = bad
    with pytest.raises(ValueError, match=rf"route: .*tokens \[{where}\] .* not finite"):
        route(logits, k, cf)
    logits[where] = 0.0  # the finite tokens alone route as before
    route(logits, k, cf)


@pytest.mark.parametrize("k", [1, 2])
def test_an_empty_batch_has_aux_loss_zero(k):
    y, aux = MoE(8, 16, 4, k=k)(torch.zeros(0, 8))
    assert y.shape == (0, 8) and float(aux.detach()) == 0.0


def _empty_on_rank_one():
    torch.manual_seed(0)
    ep = ExpertParallelMoE(MoE(8, 16, 4))
    x = torch.randn(0 if dist.get_rank() == 1 else 6, 8, requires_grad=True)
    y, aux = ep(x)
    (y.sum() + aux).backward()
    return y.shape[0], float(aux.detach())


def test_an_empty_expert_parallel_rank_has_aux_loss_zero():
    (n0, aux0), (n1, aux1) = minidist.launch(_empty_on_rank_one, 2, timeout_s=120)
    assert (n0, n1, aux1) == (6, 0, 0.0) and math.isfinite(aux0) and aux0 > 0


def _groups(kind):
    """ep/dp groups on 4 ranks: the grid, or dp_group equal to ep_group (sizes multiply)."""
    rank = dist.get_rank()
    blocks = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    strides = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    crossed = [dist.new_group([0, 3]), dist.new_group([1, 2])]
    ep = blocks[rank // 2]
    dp = {"grid": strides[rank % 2], "same": ep, "crossed": crossed[min(rank, 3 - rank)]}[kind]
    try:
        ExpertParallelMoE(MoE(8, 16, 4), ep, dp)
    except ValueError as exc:
        return str(exc)
    return "accepted"


@pytest.mark.parametrize(
    "kind, want",
    [("grid", "accepted"), ("same", "share [0, 1]"), ("crossed", "different places")],
)
def test_groups_that_do_not_form_a_grid_are_refused_on_every_rank(kind, want):
    texts = minidist.launch(_groups, 4, kind, timeout_s=120)
    assert len(set(texts)) == 1 and want in texts[0], texts


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10**6), st.integers(2, 4))
def test_moe_gpt_seeds_each_layer_apart(seed, layers):
    from minidist.expert_parallel.gpt import moe_gpt
    from minidist.models import GPTConfig

    cfg = GPTConfig(vocab_size=16, seq_len=8, layers=layers, heads=2, hidden=8)
    model = moe_gpt(cfg, 4, seed=seed)
    routers = [block.mlp.moe.router.weight for block in model.blocks]
    for i, w in enumerate(routers):  # layer i is the MoE seeded seed + i
        assert torch.equal(w, MoE(8, 32, 4, seed=seed + i).router.weight)
        assert all(not torch.equal(w, o) for o in routers[i + 1 :])


def _nan_on_rank_one(pad=False):
    torch.manual_seed(0)
    ep = ExpertParallelMoE(MoE(8, 16, 4), pad_to_capacity=pad)
    x = torch.randn(6, 8)
    if dist.get_rank() == 1:
        x[2, 3] = math.nan
    try:
        ep(x)
    except ValueError as exc:
        return str(exc)
    return "accepted"


@pytest.mark.parametrize("pad", [False, True])  # padded: no counts travel, NaN rows do
def test_a_nan_token_on_one_expert_parallel_rank_stops_every_rank_with_an_error(pad):
    mine, theirs = minidist.launch(_nan_on_rank_one, 2, pad, timeout_s=60)[::-1]
    assert "route: the router's logits of tokens [2] (of 6) are not finite" in mine
    assert "ranks [1] of the ep_group routed tokens that are not finite" in theirs


def _padded_tokens(counts, k):
    """Padded to capacity, rank r routes counts[r][i] tokens at forward i; the error text, or
    the ledger's tags over every forward."""
    from minidist import comm

    torch.manual_seed(0)
    ep = ExpertParallelMoE(MoE(8, 16, 4, k=k), pad_to_capacity=True)
    try:
        with comm.record() as ledger:
            for n in counts[dist.get_rank()]:
                y, aux = ep(torch.randn(n, 8, requires_grad=True))
                (y.sum() + aux).backward()
    except ValueError as exc:
        return str(exc)
    return sorted({r.tag for r in ledger.records})


@pytest.mark.parametrize("k", [1, 2])  # k = 2: capacities 3 and 4 (gloo aborted before)
def test_padded_ranks_with_different_token_counts_get_one_error_on_every_rank(k):
    texts = minidist.launch(_padded_tokens, 2, [[6], [8]], k, timeout_s=60)
    assert texts[0] == texts[1], texts
    assert "ranks [0, 1] of the ep_group routed [6, 8] tokens" in texts[0]
    assert "every rank must route the same number" in texts[0]


def test_padded_counts_changing_on_every_rank_at_once_are_accepted_off_the_ledger():
    """8, 8, then 4 tokens on both ranks (a shorter last batch): checked at the first
    forward and at the change, neither check in the ledger; a difference at the change is
    refused on both ranks."""
    tags = minidist.launch(_padded_tokens, 2, [[8, 8, 4], [8, 8, 4]], 2, timeout_s=60)
    four = ["ep combine", "ep combine grad", "ep dispatch", "ep dispatch grad"]
    assert tags == [four, four]  # no "ep padded tokens": the per-step bytes are as planned
    texts = minidist.launch(_padded_tokens, 2, [[8, 4], [8, 6]], 2, timeout_s=60)
    assert texts[0] == texts[1] and "routed [4, 6] tokens" in texts[0], texts
