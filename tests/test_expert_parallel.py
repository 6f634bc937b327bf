"""Expert parallelism (lesson 16): the expert-parallel MoE equals the same MoE in one process
(outputs, aux loss, routing, the same tokens dropped, gradients, parameters after training),
alone and composed with data parallelism, and the ledger's bytes equal the theory for the
measured routing (Lepikhin et al. 2020, GShard; Fedus et al. 2021, Switch Transformer)."""

import pytest
import torch
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import minidist
from minidist.expert_parallel import MoE, theory
from minidist.expert_parallel.fixture import TOKENS, reference, send_matrix, train_on_rank
from minidist.expert_parallel.parallel import ExpertParallelMoE
from minidist.expert_parallel.routing import capacity, dispatch, load_balancing_loss, route

# Tolerance: float32; the ranks compute the same rows as the reference, batched differently
# (an expert sees rows from several ranks), so sums may round differently: outputs, aux and
# parameters within 1e-6 absolute (measured: under 1e-7); gradients (about 1e-4) within
# 1e-5 relative + 1e-8 (measured: under 2e-9). Routing and drops must be EXACTLY equal.
TOL = 1e-6
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)

# (e, k, capacity factor, padded to capacity)
CONFIGS = {
    2: [(2, 1, 1.0, False), (2, 2, 1.25, False), (2, 2, 1.0, True)],
    4: [
        (4, 1, 1.0, False),
        (4, 2, 1.0, False),
        (2, 1, 1.0, False),
        (2, 2, 1.5, False),
        (4, 1, 1.0, True),
        (2, 2, 1.0, True),
    ],
}


def _world(configs):
    """On a rank: every config trained, then what a bad placement is refused with."""
    runs = [train_on_rank(e, k, cf, pad_to_capacity=pad) for e, k, cf, pad in configs]
    refused = []
    n = torch.distributed.get_world_size()
    halves = [torch.distributed.new_group(list(range(i, i + n // 2))) for i in (0, n // 2)]
    try:  # experts over half the world, no dp_group: the halves' copies never meet
        ExpertParallelMoE(MoE(8, 8, 4), halves[torch.distributed.get_rank() * 2 // n])
        refused.append("")
    except ValueError as e:
        refused.append(str(e))
    for bad in (
        lambda: ExpertParallelMoE(MoE(8, 8, 6)),
        lambda: ExpertParallelMoE(MoE(8, 8, 4))(torch.randn(2, 3, 8)),
        lambda: ExpertParallelMoE(MoE(8, 8, 4), pad_to_capacity="yes"),
    ):
        try:
            bad()
            refused.append("")
        except ValueError as e:
            refused.append(str(e))
    return runs, refused


@pytest.mark.parametrize("n", [2, 4])
def test_expert_parallel_equals_one_process_and_its_bytes_the_theory(n):
    results = minidist.launch(_world, n, CONFIGS[n])
    if n == 4:
        assert "divisible by the expert-parallel group's size 4" in results[0][1][1]
    assert "x must be [tokens, 8] (this rank's tokens); got (2, 3, 8)" in results[0][1][2]
    assert "pad_to_capacity='yes' must be True or False" in results[0][1][3]
    assert (
        f"ep_group ({n // 2} ranks) × dp_group (1) must cover the world of {n}"
        in (results[0][1][0])
    )
    for c, (e, k, cf, pad) in enumerate(CONFIGS[n]):
        ref, ref_params = reference(n, k, cf)
        runs = [res[0][c] for res in results]
        d = n // e
        assert not bool(torch.cat([s.kept for s in ref]).all()), "no token was dropped"
        for rank, run in enumerate(runs):
            rows = slice(rank * TOKENS, (rank + 1) * TOKENS)
            for step, (mine, want) in enumerate(zip(run.trace, ref)):
                assert torch.equal(mine.experts, want.experts[rows])
                assert torch.equal(mine.kept, want.kept[rows])  # the same tokens dropped
                assert torch.allclose(mine.out, want.out[rows], atol=TOL)
                assert float(mine.aux) == pytest.approx(float(want.aux[rank]), abs=TOL)
                for name, g in mine.grads.items():
                    full = want.grads[name][rows] if name == "input" else want.grads[name]
                    assert torch.allclose(g, full, rtol=1e-5, atol=1e-8), (name, step)
                # the ledger: this step's all-to-alls against the theory for the routing
                send = send_matrix(runs, e, step, rank // e)
                per = theory.all_to_all_bytes(send, rank % e, 16)
                if pad:  # static shapes: E/e·C rows to every rank, whatever the routing
                    per = theory.padded_all_to_all_bytes(8, e, capacity(TOKENS, 8, k, cf), 16)
                for tag, want_bytes in per.items():
                    got = [r.ring_bytes for r in run.records if r.tag == tag]
                    assert got[step] == want_bytes, (tag, step)
            for name, p in run.params.items():
                assert torch.allclose(p, ref_params[name], atol=TOL), name
            total = sum(r.ring_bytes for r in run.records)
            want_total = sum(
                theory.bytes_sent_per_step(
                    send_matrix(runs, e, s, rank // e),
                    rank % e,
                    16,
                    8,
                    run.router_params,
                    run.expert_params,
                    n,
                    d,
                    counts=not pad,
                )
                for s in range(len(run.trace))
            )
            assert total == pytest.approx(want_total)
            assert pad != any(r.tag == "ep counts" for r in run.records)  # padded: no counts
            grads = [r for r in run.records if r.tag == "ep expert grads"]
            if d > 1:  # EP × DP: experts reduce over the ranks that hold them
                assert all(r.group_ranks == tuple(range(rank % e, n, e)) for r in grads)
            else:
                assert not grads


def test_capacity_priority_and_gates():
    assert theory.capacity(10, 4, 1, 1.0) == 3  # ⌈2.5⌉
    assert theory.capacity(10, 4, 2, 1.25) == 7  # ⌈6.25⌉
    logits = torch.tensor([[3.0, 2.0, 0.0], [3.0, 0.0, 2.0], [0.0, 3.0, 2.0], [3.0, 2.0, 0.0]])
    r = route(logits, k=2, capacity_factor=0.5)  # C = ⌈0.5·4·2/3⌉ = 2
    assert r.capacity == 2
    # expert 0 is first choice of tokens 0, 1, 3: token 3 dropped; expert 1 is the first
    # choice of token 2, then second choice of tokens 0 and 3: token 3's dropped (priority)
    assert r.kept.tolist() == [[True, True], [True, True], [True, True], [False, False]]
    assert torch.allclose(r.gates.sum(-1), torch.ones(4))  # k = 2: renormalised (GShard)
    r1 = route(logits, k=1)
    assert torch.allclose(r1.gates[:, 0], torch.softmax(logits, -1).max(-1).values)  # Switch


def test_dispatch_and_aux_loss():
    ids = torch.tensor([0, 1, 0, 0, 2, 0, 1])
    kept, dropped = dispatch(ids, 3, 1.0)[0]  # C = ⌈7/3⌉ = 3
    assert kept.tolist() == [0, 2, 3] and dropped.tolist() == [5]
    e = 4
    uniform = torch.full((8, e), 1 / e)
    assert float(load_balancing_loss(uniform, torch.arange(8) % e)) == pytest.approx(1.0)
    one = torch.nn.functional.one_hot(torch.zeros(8, dtype=torch.long), e).float()
    assert float(load_balancing_loss(one, torch.zeros(8, dtype=torch.long))) == pytest.approx(e)


def test_dropped_tokens_add_nothing_and_bad_input_is_refused():
    moe = MoE(8, 16, 4, k=1, capacity_factor=0.5)
    x = torch.randn(16, 8)
    y, _ = moe(x)
    dropped = ~moe.routings[0].kept[:, 0]
    assert dropped.any() and bool((y[dropped] == 0).all())
    with pytest.raises(ValueError, match="divisible by groups=3"):
        moe(x, groups=3)
    with pytest.raises(ValueError, match="k=5"):
        MoE(8, 16, 4, k=5)
    with pytest.raises(ValueError, match="capacity_factor=0"):
        theory.capacity(4, 2, 1, 0)
    with pytest.raises(ValueError, match="logits must be"):
        route(torch.zeros(2, 3, 4))


def test_ties_keep_capacity_and_route_every_group_alike():
    tied = torch.zeros(12, 4)  # every expert equally likely: torch.topk's order decides
    r = route(tied, k=2, capacity_factor=1.0)
    kept_per_expert = torch.bincount(r.experts[r.kept], minlength=4)
    assert int(kept_per_expert.max()) <= r.capacity == 6
    assert (r.experts[:, 0] != r.experts[:, 1]).all()  # two different experts per token
    again = route(tied.clone(), k=2, capacity_factor=1.0)
    assert torch.equal(again.experts, r.experts) and torch.equal(again.kept, r.kept)


@pytest.mark.parametrize("e", [1, 2, 4, 8])
def test_balanced_routing_bytes_match_the_planning_formula(e):
    tokens, k, h = 32, 2, 16
    even = [[tokens * k // e] * e for _ in range(e)]  # send[i][j]: T·k/e to every rank
    for rank in range(e):
        got = sum(theory.all_to_all_bytes(even, rank, h).values())
        assert got == theory.balanced_all_to_all_bytes(tokens, h, k, e)


# -- the MoE GPT: experts over ranks in a whole model (EP × DP) -------------------------------

GPT_CONFIGS = {2: [(2, True), (2, False)], 4: [(2, True), (4, True), (4, False)]}


def _gpt_world(configs):
    from minidist.expert_parallel.fixture import gpt_train_on_rank
    from minidist.expert_parallel.gpt import ExpertParallelGPT
    from minidist.models import GPT

    runs = [gpt_train_on_rank(e, pad) for e, pad in configs]
    try:
        ExpertParallelGPT(GPT())
        refused = ""
    except ValueError as err:
        refused = str(err)
    return runs, refused


@pytest.mark.parametrize("n", [2, 4])
def test_expert_parallel_gpt_equals_one_process_and_its_bytes_need_no_routing(n):
    """Losses (the ranks' mean) and every parameter after 3 steps of SGD + momentum equal the
    MoE GPT in one process routing the same groups (float32: within 1e-5, measured ~2e-7);
    padded to capacity, the ledger equals `padded_bytes_sent_per_step` exactly, a number
    that needs no routing; unpadded, it differs from it by the routing."""
    from minidist.expert_parallel.fixture import GPT_BATCH, MOE_GPT, gpt_reference
    from minidist.expert_parallel.lesson import gpt_theory

    results = minidist.launch(_gpt_world, n, GPT_CONFIGS[n])
    assert (
        "model must come from moe_gpt (every block's mlp an MoEMLP), got Sequential"
        in (results[0][1])
    )
    ref = gpt_reference(n)
    assert GPT_BATCH // n * MOE_GPT["seq_len"] >= 16  # tokens per rank: some are dropped
    for c, (e, pad) in enumerate(GPT_CONFIGS[n]):
        runs = [res[0][c] for res in results]
        for step, want in enumerate(ref.losses):
            got = sum(r.losses[step] for r in runs) / n
            assert got == pytest.approx(want, abs=1e-5), (e, pad, step)
        assert set().union(*(r.params for r in runs)) == set(ref.params)  # every expert held
        for run in runs:
            for name, p in run.params.items():
                assert torch.allclose(p, ref.params[name], atol=1e-5), (e, pad, name)
        memory, sent = gpt_theory(n, e)
        assert runs[0].memory.total == memory
        ledger = sum(r.ring_bytes for r in runs[0].records) / len(ref.losses)
        assert (ledger == pytest.approx(sent, rel=1e-12)) == pad, (e, pad, ledger, sent)
        tags = {r.tag for r in runs[0].records}
        assert ("ep expert grads" in tags) == (n // e > 1)


def _flops_on_rank(k: int, cf: float) -> tuple[int, int]:
    from torch.utils.flop_counter import FlopCounterMode

    moe = MoE(16, 32, 8, k, cf)
    ep = ExpertParallelMoE(moe, pad_to_capacity=True)
    x = torch.randn(TOKENS, 16, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        y, _ = ep(x)
        y.sum().backward()
    return counter.get_total_flops(), ep.routing.capacity


@pytest.mark.parametrize("k, cf", [(1, 1.0), (2, 1.5)])
def test_padded_flops_are_what_torch_counts(k, cf):
    """`theory.expert_flops` (E/e experts on e·C padded rows, 3x forward) plus the router's
    3 · 2·T·h·E equal torch's FlopCounterMode over forward and backward (world of 1)."""
    counted, cap = minidist.launch(_flops_on_rank, 1, k, cf)[0]
    assert counted == theory.expert_flops(8, 1, cap, 16, 32) + 3 * 2 * TOKENS * 16 * 8


def _both_dispatches(cases) -> list:
    """On a rank: per case, each dispatch's (output, input grad, router grad, expert grads,
    all-to-all bytes per tag) for this rank's tokens, experts over the whole world."""
    from minidist import comm

    rank, n = torch.distributed.get_rank(), torch.distributed.get_world_size()
    out = []
    for h, experts, k, cf, tokens, seed in cases:
        moe = MoE(h, 2 * h, experts, k, cf, seed=seed)
        x = torch.randn(n * tokens, h, generator=torch.Generator().manual_seed(seed))
        per = []
        for pad in (False, True):
            ep = ExpertParallelMoE(moe, pad_to_capacity=pad)
            xr = x.chunk(n)[rank].clone().requires_grad_()
            with comm.record() as ledger:
                y, _ = ep(xr)
                (y**2).sum().backward()
            names = {"router.weight": "router.weight"} | ep.expert_names()
            grads = {names[m]: p.grad for m, p in ep.named_parameters() if p.grad is not None}
            sent = {}
            for r in ledger.records:
                sent[r.tag] = sent.get(r.tag, 0.0) + r.ring_bytes
            per.append((y.detach(), xr.grad, grads, sent, ep.routing.capacity))
        out.append(per)
    return out


@settings(max_examples=3, deadline=None, phases=NO_SHRINK)  # each example launches a world
@given(
    world=st.sampled_from([2, 4]),
    cases=st.lists(
        st.tuples(
            st.sampled_from([4, 8]),
            st.sampled_from([4, 8]),
            st.integers(1, 2),
            st.sampled_from([0.5, 1.0, 1.25, 2.0]),
            st.integers(1, 13),
            st.integers(0, 99),
        ),
        min_size=2,
        max_size=3,
    ),
)
def test_padded_and_exact_dispatch_equal_one_process_over_the_range(world, cases):
    """Hidden sizes, E, k, capacity factors and token counts that do not divide (ceil
    capacities, empty experts): both dispatches give the one-process MoE's outputs and
    gradients, and the padded one sends exactly `padded_all_to_all_bytes`."""
    cases = [c for c in cases if c[1] % world == 0]
    if not cases:
        return
    results = minidist.launch(_both_dispatches, world, cases)
    for c, (h, experts, k, cf, tokens, seed) in enumerate(cases):
        moe = MoE(h, 2 * h, experts, k, cf, seed=seed)
        x = torch.randn(world * tokens, h, generator=torch.Generator().manual_seed(seed))
        x.requires_grad_()
        y, _ = moe(x, world)
        (y**2).sum().backward()
        want_grads = {m: p.grad for m, p in moe.named_parameters() if p.grad is not None}
        for i, pad in enumerate((False, True)):
            router = sum(results[rank][c][i][2]["router.weight"] for rank in range(world))
            assert torch.allclose(router, want_grads["router.weight"], atol=1e-5), (c, pad)
        for rank in range(world):
            rows = slice(rank * tokens, (rank + 1) * tokens)
            for pad, (got, xgrad, grads, sent, cap) in zip((False, True), results[rank][c]):
                assert torch.allclose(got, y.detach()[rows], atol=1e-6), (c, pad)
                assert torch.allclose(xgrad, x.grad[rows], atol=1e-5), (c, pad)
                for name, g in grads.items():  # an expert's: every rank's tokens routed to it
                    want = want_grads.get(name, torch.zeros_like(g))
                    assert name == "router.weight" or torch.allclose(g, want, atol=1e-5), name
                if pad:
                    want = theory.padded_all_to_all_bytes(experts, world, cap, h)
                    assert {t: sent.get(t, 0.0) for t in want} == want, (c, sent)
                    assert "ep counts" not in sent
