"""GeePS's parameter cache (Cui et al. 2016, sections 3-4): training through it equals
training without it bitwise (it only moves data); the device tier's resident bytes per
(phase, layer), its peak and the bytes moved per step equal `parameter_server.theory`."""

import pytest
import torch
import torch.nn as nn

import minidist
from minidist.data_parallel.fixture import build
from minidist.parameter_server import theory
from minidist.parameter_server.cache import ParameterCache, layer_bytes
from minidist.parameter_server.fixture import ServerResult, WorkerResult, train_on_rank
from minidist.training import make_optimizer

STEPS = 4


def _train(prefetch: int | None, **sizes):
    model, batches, loss_fn = build("mlp", steps=STEPS, **sizes)
    opt = make_optimizer([p for p in model.parameters() if p.requires_grad], "sgd")
    cache = None if prefetch is None else ParameterCache(model.layers, prefetch)
    losses = []
    for x, y in batches:
        model.zero_grad()
        if cache:
            with cache.step():
                loss = loss_fn(model(x), y)
                loss.backward()
        else:
            loss = loss_fn(model(x), y)
            loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses, cache


@pytest.mark.parametrize("prefetch", [0, 1, 2, 4])
@pytest.mark.parametrize("sizes", [{}, {"layers": 5, "hidden": 24}])
def test_cache_equals_no_cache_and_theory(prefetch, sizes):
    plain, plain_losses, _ = _train(None, **sizes)
    cached, losses, cache = _train(prefetch, **sizes)
    # exact: the cache copies values, it computes nothing differently
    assert losses == plain_losses
    for (name, a), b in zip(plain.state_dict().items(), cached.state_dict().values()):
        assert torch.equal(a, b), name
    per_layer = [layer_bytes(m) for m in cached.layers]
    trace = theory.cache_resident_trace(per_layer, prefetch)
    events = [e.__dict__ for e in cache.events]
    assert events == trace * STEPS  # every step the same walk, measured from the storages
    assert max(e.resident_bytes for e in cache.events) == theory.cache_peak_resident_bytes(
        per_layer, prefetch
    )
    psi_bytes = 4 * sum(p.numel() for p in cached.parameters() if p.requires_grad)
    moved = theory.cache_bytes_moved_per_step(per_layer, psi_bytes)
    assert sum(e.moved_in for e in cache.events) == STEPS * moved["host_to_device"]
    assert cache.moved_out == STEPS * moved["device_to_host"]
    assert cache.resident_bytes() == 0  # the step ended with everything evicted


def test_cache_theory_by_hand():
    b = [100, 400, 300, 50]
    assert theory.cache_peak_resident_bytes(b, 0) == 400
    assert theory.cache_peak_resident_bytes(b, 1) == 700  # layers 1 and 2
    assert theory.cache_peak_resident_bytes(b, 3) == 850  # everything
    assert theory.cache_bytes_moved_per_step(b, 10) == {
        "host_to_device": 2 * 850 - 50,
        "device_to_host": 10,
    }
    assert theory.cache_window(1, 4, 1, "backward") == [0, 1]
    assert theory.cache_window(3, 4, 2, "forward") == [3]


def test_cache_bad_input_is_named():
    model = build("mlp").model
    with pytest.raises(ValueError, match="prefetch must be an int >= 0 .*got -1"):
        ParameterCache(model.layers, -1)
    with pytest.raises(ValueError, match="non-empty list of modules"):
        ParameterCache([], 1)
    shared = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="layer 1 shares a parameter"):
        ParameterCache([shared, shared], 1)
    mixed = nn.Linear(2, 2)
    mixed.bias.data = mixed.bias.data.double()
    with pytest.raises(ValueError, match="share one dtype"):
        ParameterCache([mixed], 0)
    # nothing was hooked by the failed constructions: the model runs as before
    assert not model.layers[0]._forward_pre_hooks


def test_parameter_server_workers_through_the_cache_equal_without():
    plain = minidist.launch(train_on_rank, 3, 1, 2, "bsp")
    cached = minidist.launch(train_on_rank, 3, 1, 2, "bsp", cache_prefetch=1)
    for a, b in zip(plain, cached):
        if isinstance(a, ServerResult):
            assert torch.equal(a.values, b.values)
        else:
            assert a.losses == b.losses
            assert all(torch.equal(a.params[k], b.params[k]) for k in a.params)
    worker = next(r for r in cached if isinstance(r, WorkerResult))
    per_layer = [layer_bytes(m) for m in build("mlp").model.layers]
    steps = len(worker.losses)
    assert [e.__dict__ for e in worker.cache_events] == theory.cache_resident_trace(
        per_layer, 1
    ) * steps
    psi = sum(p.numel() for p in build("mlp").model.parameters() if p.requires_grad)
    assert worker.cache_moved_out == steps * 4 * psi
