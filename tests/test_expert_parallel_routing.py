"""Lesson 16's router against its definition, token by token, on random groups: capacity,
priority, slots, gates, the auxiliary loss (value and gradient) and the MoE's combine
(Fedus et al. 2021, Switch Transformer, section 2.1-2.2; Lepikhin et al. 2020, GShard,
section 2.2 and Algorithm 1). No process group: routing is per group of tokens."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.expert_parallel import MoE
from minidist.expert_parallel.routing import dispatch, route, tokens_per_expert

# Tolerance: float64 throughout; the router sums in another order than the loops here.
TOL = 1e-12


def _expected(logits: torch.Tensor, k: int, capacity_factor: float):
    """The conventions of routing.py written out as loops: (capacity, experts, gates, slot,
    kept, aux as a function of the probabilities)."""
    tokens, e = logits.shape
    cap = math.ceil(capacity_factor * tokens * k / e)
    probs = torch.softmax(logits, -1)
    experts = [sorted(range(e), key=lambda x: -float(logits[t, x]))[:k] for t in range(tokens)]
    chosen = torch.stack([probs[t, experts[t]] for t in range(tokens)])
    gates = chosen if k == 1 else chosen / chosen.sum(-1, keepdim=True)
    seen = [0] * e
    slot = [[0] * k for _ in range(tokens)]
    for j in range(k):  # every first choice before any second choice (GShard Algorithm 1)
        for t in range(tokens):
            slot[t][j] = seen[experts[t][j]]
            seen[experts[t][j]] += 1
    slot = torch.tensor(slot)
    first = [experts[t][0] for t in range(tokens)]  # before dropping
    f = torch.tensor([first.count(x) / tokens for x in range(e)], dtype=logits.dtype)
    return cap, torch.tensor(experts), gates, slot, slot < cap, lambda p: e * (f * p.mean(0)).sum()


@settings(max_examples=60, deadline=None)
@given(
    tokens=st.integers(1, 24),
    e=st.integers(1, 6),
    k=st.integers(1, 2),
    capacity_factor=st.sampled_from([0.25, 0.5, 1.0, 1.25, 2.0]),
    seed=st.integers(0, 2**16),
    skew=st.floats(0.0, 3.0),
)
def test_route_equals_its_definition_token_by_token(tokens, e, k, capacity_factor, seed, skew):
    k = min(k, e)
    g = torch.Generator().manual_seed(seed)
    # continuous logits (no ties), skewed towards expert 0 so that some groups drop tokens
    logits = torch.randn(tokens, e, generator=g, dtype=torch.float64)
    logits[:, 0] += skew
    logits.requires_grad_()
    r = route(logits, k, capacity_factor)
    cap, experts, gates, slot, kept, aux_of = _expected(logits.detach(), k, capacity_factor)
    assert r.capacity == cap
    assert torch.equal(r.experts, experts)
    assert torch.allclose(r.gates.detach(), gates, atol=TOL, rtol=0)
    assert torch.equal(r.slot, slot) and torch.equal(r.kept, kept)
    kept_n, dropped_n = tokens_per_expert(r, e)
    assert kept_n.tolist() == [int(kept[experts == x].sum()) for x in range(e)]
    assert dropped_n.tolist() == [int((~kept)[experts == x].sum()) for x in range(e)]
    if k == 1:  # top-1 dispatch: per expert, its kept then its dropped tokens, in order
        for x, (kept_t, dropped_t) in enumerate(dispatch(experts[:, 0], e, capacity_factor)):
            mine = [t for t in range(tokens) if int(experts[t, 0]) == x]
            assert kept_t.tolist() == [t for t in mine if kept[t, 0]]
            assert dropped_t.tolist() == [t for t in mine if not kept[t, 0]]
    # the aux loss: its value, and its gradient reaches the router's logits through P_e
    want = aux_of(torch.softmax(logits, -1))
    assert float(r.aux.detach()) == pytest.approx(float(want.detach()), abs=TOL)
    got_grad = torch.autograd.grad(r.aux, logits, retain_graph=True)[0]
    want_grad = torch.autograd.grad(want, logits)[0]
    assert torch.allclose(got_grad, want_grad, atol=TOL, rtol=0)


def test_aux_loss_counts_first_choices_before_dropping():
    # every token prefers expert 0; capacity 1 keeps one of them: f_0 is still 1
    logits = torch.tensor([[2.0, 0.0]] * 4, dtype=torch.float64)
    r = route(logits, k=1, capacity_factor=0.5)
    assert r.kept[:, 0].tolist() == [True, False, False, False]
    p0 = float(torch.softmax(logits[0], -1)[0])
    assert float(r.aux) == pytest.approx(2 * 1.0 * p0)
    assert tokens_per_expert(r, 2)[1].tolist() == [3, 0]


@pytest.mark.parametrize("k", [1, 2])
def test_moe_output_is_the_gated_sum_of_the_kept_experts_per_group(k):
    moe = MoE(6, 8, 4, k=k, capacity_factor=0.75, seed=3).double()
    x = torch.randn(12, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    y, aux = moe(x, groups=2)
    want = torch.zeros_like(x)
    for gi, (xg, r) in enumerate(zip(x.chunk(2), moe.routings)):
        for t in range(xg.shape[0]):
            for j in range(k):
                if r.kept[t, j]:
                    expert = moe.experts[int(r.experts[t, j])]
                    want[gi * 6 + t] += r.gates[t, j] * expert(xg[t])
    assert not bool(torch.cat([r.kept for r in moe.routings]).all()), "no token was dropped"
    assert torch.allclose(y, want, atol=TOL, rtol=0)
    auxes = [float(r.aux.detach()) for r in moe.routings]
    assert float(aux.detach()) == pytest.approx(sum(auxes) / 2)  # the mean over the groups
