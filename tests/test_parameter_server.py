"""A parameter server on a real world: BSP equals one process (and all-reduce data
parallelism), SSP with s = 0 equals BSP, SSP never exceeds its bound, async runs; the ledger
equals `minidist.parameter_server.theory`."""

import pytest
import torch

import minidist
from minidist.data_parallel.fixture import build
from minidist.data_parallel.fixture import reference as dp_reference
from minidist.parameter_server import check_roles, key_ranges, keys, owner, staleness_bound, theory
from minidist.parameter_server.fixture import (
    ServerResult,
    WorkerResult,
    assemble,
    reference,
    train_on_rank,
)
from minidist.training import max_abs_diff

# float32; the server averages W slice gradients where one process takes one mean over the
# batch: a few ulps per step through 5 momentum steps, as in data parallelism.
LOSS_TOL, GRAD_TOL, PARAM_TOL = 1e-5, 1e-6, 1e-5
STEPS = 8  # clocks of the staleness runs
SLOW_S = 0.05  # the slow worker's extra seconds per clock


def _split(results):
    servers = [r for r in results if isinstance(r, ServerResult)]
    workers = [r for r in results if isinstance(r, WorkerResult)]
    return servers, workers


def _psi() -> int:
    return sum(p.numel() for p in keys.trainable(build("mlp").model))


@pytest.mark.parametrize("servers, workers", [(1, 2), (2, 2), (2, 3)])
def test_bsp_equals_single_process(servers, workers):
    batch = 4 * workers  # every worker gets an equal slice
    results = minidist.launch(
        train_on_rank, servers + workers, servers, workers, "bsp", global_batch=batch
    )
    served, trained = _split(results)
    ref = reference(global_batch=batch)
    mean_losses = torch.tensor([w.losses for w in trained]).mean(0)
    assert torch.allclose(mean_losses, torch.tensor(ref.losses), atol=LOSS_TOL, rtol=0)
    values, last_update = assemble(results)
    ref_model = build("mlp").model
    flat_ref_grad = torch.cat(
        [ref.grads[n].reshape(-1) for n, p in ref_model.named_parameters() if p.requires_grad]
    )
    assert float((last_update - flat_ref_grad).abs().max()) < GRAD_TOL
    for w in trained:
        assert max_abs_diff(w.params, ref.params) < PARAM_TOL
        # the final pull returns exactly what the servers hold
        assert torch.equal(keys.flat_values(_load(w.params)), values)
    for s in served:
        assert all(a.staleness == 0 for a in s.applied)
        assert len(s.applied) == workers * 5


def _load(params):
    model = build("mlp").model
    model.load_state_dict(params, strict=False)
    return model


def test_bsp_equals_all_reduce_data_parallelism():
    # DP's reference is what naive and bucketed DP are tested equal to (test_data_parallel)
    results = minidist.launch(train_on_rank, 3, 1, 2, "bsp")
    _, trained = _split(results)
    assert max_abs_diff(trained[0].params, dp_reference("mlp").params) < PARAM_TOL


def test_ssp_zero_equals_bsp():
    bsp = minidist.launch(train_on_rank, 4, 2, 2, "bsp")
    ssp = minidist.launch(train_on_rank, 4, 2, 2, "ssp", 0)
    assert torch.equal(assemble(bsp)[0], assemble(ssp)[0])  # same updates, same order
    for a, b in zip(_split(bsp)[1], _split(ssp)[1]):
        assert a.losses == b.losses


@pytest.mark.parametrize("bound", [1, 2])
def test_ssp_staleness_never_exceeds_bound_with_a_slow_worker(bound):
    results = minidist.launch(
        train_on_rank,
        4,
        1,
        3,
        "ssp",
        bound,
        steps=STEPS,
        global_batch=12,
        delay_s={2: SLOW_S},
        timeout_s=30,
    )
    served, trained = _split(results)
    stale = [a.staleness for a in served[0].applied]
    assert len(stale) == 3 * STEPS
    assert max(stale) <= bound
    # the fast workers really ran ahead: they used the whole bound (8 clocks of 50 ms leave
    # them time to, even on a loaded 2-core machine)
    assert max(a.staleness for a in served[0].applied if a.worker != 2) == bound
    for w in trained:  # each pull got at least clock - s
        assert all(v[0] >= clock - bound for clock, v in enumerate(w.read_versions))


def test_async_records_staleness_beyond_any_bound():
    results = minidist.launch(
        train_on_rank,
        4,
        1,
        3,
        "async",
        steps=STEPS,
        global_batch=12,
        delay_s={2: SLOW_S},
        timeout_s=30,
    )
    served, trained = _split(results)
    stale = [a.staleness for a in served[0].applied]
    assert len(stale) == 3 * STEPS and min(stale) >= 0
    # the fast workers finish all clocks while the slow one is still at its first ones
    assert max(stale) > 2
    assert all(torch.isfinite(torch.tensor(w.losses)).all() for w in trained)


def test_ledger_equals_theory():
    servers, workers, steps = 2, 3, 5
    results = minidist.launch(
        train_on_rank, servers + workers, servers, workers, "bsp", global_batch=12
    )
    served, trained = _split(results)
    psi = _psi()
    per_worker = theory.worker_bytes_per_step(psi)
    for w in trained:
        recs = w.ledger.records
        pushed = sum(r.payload_bytes for r in recs if r.op == "send" and r.tag == "push")
        pulled = sum(r.payload_bytes for r in recs if r.op == "recv" and r.tag == "pull")
        headers = sum(r.payload_bytes for r in recs if r.op == "send" and r.tag == "ps-header")
        assert pushed == steps * per_worker["pushed"]
        # a pull per clock, plus the final one; each answer is the version, then the values
        assert pulled == (steps + 1) * (per_worker["pulled"] + servers * theory.VERSION_BYTES)
        # per server: a pull and a push header per clock, the final pull, done
        assert headers == servers * (2 * steps + 2) * theory.HEADER_BYTES
    for s in served:
        expect = theory.server_bytes_per_step(psi, servers, workers, s.server)
        recs = s.ledger.records
        got = sum(r.payload_bytes for r in recs if r.op == "recv" and r.tag == "push")
        sent = sum(r.payload_bytes for r in recs if r.op == "send" and r.tag == "pull")
        assert got == steps * expect["received"]
        # each answer: the version (1 int64), then the values
        assert sent == (steps + 1) * (expect["sent"] + workers * theory.VERSION_BYTES)


def test_theory_ps_against_ring():
    psi = 10**6
    # a worker moves Ψ each way; a single server receives W·Ψ; S = W servers receive Ψ each
    assert theory.server_bytes_per_step(psi, 1, 8, 0)["received"] == 8 * 4 * psi
    assert theory.server_bytes_per_step(psi, 8, 8, 0)["received"] == 4 * psi
    assert theory.ring_bytes_per_step(psi, 8) == pytest.approx(2 * 7 / 8 * 4 * psi)
    link = theory.Link(1e-5, 10e9)
    assert theory.ps_step_time(psi, 1, 8, link) > 4 * theory.ring_step_time(psi, 8, link)
    assert theory.ps_step_time(psi, 8, 8, link) < 1.3 * theory.ring_step_time(psi, 8, link)


def test_failing_worker_fails_the_world_with_its_rank():
    with pytest.raises(minidist.RankFailedError, match=r"rank 3 failed(.|\n)*worker 1 failed"):
        minidist.launch(train_on_rank, 4, 2, 2, "bsp", fail_worker_at=(1, 2), timeout_s=30)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="servers must be an int >= 1, got 0"):
        check_roles(3, 0, 3)
    with pytest.raises(ValueError, match="workers must be an int >= 1, got 0"):
        check_roles(3, 3, 0)
    with pytest.raises(ValueError, match=r"servers=2 \+ workers=2 = 4 ranks, but world_size=5"):
        check_roles(5, 2, 2)
    with pytest.raises(ValueError, match="staleness >= 0, got staleness=-1"):
        staleness_bound("ssp", -1)
    with pytest.raises(ValueError, match="consistency must be one of"):
        staleness_bound("eventual")
    assert key_ranges(10, 3) == [(0, 4), (4, 8), (8, 10)]
    assert owner(9, key_ranges(10, 3)) == 2
    with pytest.raises(KeyError, match="key=10 is outside"):
        owner(10, key_ranges(10, 3))
    with pytest.raises(minidist.RankFailedError, match="world_size=4"):
        minidist.launch(train_on_rank, 4, 2, 3, "bsp", timeout_s=30)


def test_server_state_bytes_is_measured():
    # a server holds its range's values, their averaged gradient and the momentum buffer
    results = minidist.launch(train_on_rank, 4, 2, 2, "bsp")
    served, _ = _split(results)
    psi = _psi()
    for s in served:
        assert s.state_bytes == theory.server_state_bytes(psi, 2, s.server)
    assert theory.server_state_bytes(10, 3, 2) == 3 * 2 * 4


# -- Downpour (Dean et al. 2012, section 4.1): every push applied on arrival ------------------


def test_downpour_one_worker_is_one_process_sgd_exactly():
    # fetch and push every step, one worker: the server's step is the reference's, bitwise
    results = minidist.launch(train_on_rank, 2, 1, 1, "downpour")
    served, trained = _split(results)
    ref = reference()
    assert trained[0].losses == ref.losses
    assert all(torch.equal(trained[0].params[k], v) for k, v in ref.params.items())
    assert [a.staleness for a in served[0].applied] == [0] * len(ref.losses)


@pytest.mark.parametrize("n_fetch, n_push", [(3, 1), (3, 2), (2, 3)])
def test_downpour_one_worker_staleness_is_the_schedule(n_fetch, n_push):
    steps = 12
    results = minidist.launch(
        train_on_rank, 3, 2, 1, "downpour", steps=steps, n_fetch=n_fetch, n_push=n_push
    )
    served, trained = _split(results)
    expect = theory.downpour_own_staleness(steps, n_fetch, n_push)
    for s in served:  # each server counts its own versions: the same schedule
        assert [a.staleness for a in s.applied] == expect
        assert [a.applied_version for a in s.applied] == list(range(len(expect)))
    assert len(trained[0].read_versions) == -(-steps // n_fetch)


def test_downpour_three_workers_loss_falls_and_staleness_is_recorded():
    steps, n_fetch, n_push = 30, 2, 1
    results = minidist.launch(
        train_on_rank,
        4,
        1,
        3,
        "downpour",
        steps=steps,
        global_batch=12,
        n_fetch=n_fetch,
        n_push=n_push,
        timeout_s=60,
    )
    served, trained = _split(results)
    applied = served[0].applied
    assert len(applied) == 3 * steps  # every push applied, one optimizer step each
    assert sorted(a.applied_version for a in applied) == list(range(3 * steps))
    own = theory.downpour_own_staleness(steps, n_fetch, n_push)
    for w in range(3):
        mine = [a for a in applied if a.worker == w]
        assert [a.clock for a in mine] == list(range(steps))  # a worker's pushes in order
        # at least its own pushes since the fetch, at most every push applied since
        assert all(own[i] <= a.staleness <= a.applied_version for i, a in enumerate(mine))
    # the loss falls: over the 3 workers the last 5 steps' losses are 0.3-0.5 of the first
    # 5 (the interleaving decides; 12 runs on 2 cores); 0.7 leaves room
    first = sum(sum(w.losses[:5]) for w in trained)
    assert sum(sum(w.losses[-5:]) for w in trained) < 0.7 * first


def test_downpour_bad_schedule_is_named():
    with pytest.raises(ValueError, match="n_fetch must be an int >= 1 .*got 0"):
        theory.downpour_own_staleness(4, 0, 1)
    with pytest.raises(minidist.RankFailedError, match="n_push must be an int >= 1"):
        minidist.launch(train_on_rank, 2, 1, 1, "downpour", n_push=0, timeout_s=30)


@pytest.mark.parametrize("steps, n_push", [(7, 3), (5, 2), (6, 4), (3, 5)])
def test_downpour_pushes_the_last_partial_interval(steps, n_push):
    """Steps not a multiple of n_push: the gradients accrued since the last push go out
    after the last step. One worker fetching only once steps its own copy with every
    gradient (one-process SGD); the server, applying each push with plain SGD, must end
    at the same values: every gradient pushed exactly once."""
    from minidist.parameter_server.downpour import push_steps

    lr = 0.05
    results = minidist.launch(
        train_on_rank,
        2,
        1,
        1,
        "downpour",
        steps=steps,
        n_fetch=steps,
        n_push=n_push,
        lr=lr,
        momentum=0.0,
    )
    served, _ = _split(results)
    pushes = push_steps(steps, n_push)
    assert pushes[-1] == steps - 1 and len(pushes) == -(-steps // n_push)
    assert [a.clock for a in served[0].applied] == pushes
    model, batches, loss_fn = build("mlp", steps=steps)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    values, _ = assemble(results)
    # float32: n_push gradients summed before one step instead of n_push steps
    assert (values - keys.flat_values(model)).abs().max() < 1e-6
