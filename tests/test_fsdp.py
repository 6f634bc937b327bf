"""FSDP (ZeRO-3) equals single-process Adam; memory and bytes per step equal the theory."""

from functools import partial

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import minidist
from minidist.data import shard_batch
from minidist.data_parallel.fixture import STEPS, accumulate_on_rank, accumulated_reference, build
from minidist.fsdp import FullyShardedDataParallel, theory
from minidist.fsdp.fixture import UNITS, train_on_rank
from minidist.models import Block
from minidist.training import max_abs_diff
from minidist.zero.fixture import ADAM, reference

# As for ZeRO (tests/test_zero.py): gradients agree within float32 summation order; Adam's
# ±lr steps keep near-cancelling gradients' relative error, so parameters within 1e-4.
GRAD_TOL, PARAM_TOL = 1e-6, 1e-4
TRAINING = ("all_gather", "reduce_scatter", "all_reduce")


def training_bytes(ledger) -> dict[str, float]:
    """Bytes per step by op, without the comparison contract's gathers (tag full-state)."""
    records = [r for r in ledger.records if r.tag not in ("full-state",)]
    return {op: sum(r.ring_bytes for r in records if r.op == op) / STEPS for op in TRAINING}


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", ["mlp", "gpt"])
@pytest.mark.parametrize(
    "options",
    [{}, dict(reshard_after_forward=False), dict(prefetch=False)],
    ids=["reshard", "no-reshard", "no-prefetch"],
)
def test_fsdp_equals_single_process_adam(options, name, world):
    ref = reference(name)
    for trace, *_ in minidist.launch(train_on_rank, world, name, **options):
        assert max_abs_diff(trace.grads, ref.grads) < GRAD_TOL
        assert max_abs_diff(trace.params, ref.params) < PARAM_TOL


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("reshard", [True, False])
@pytest.mark.parametrize("name", ["gpt", "mlp"])
def test_ledger_equals_theory(name, reshard, world):
    """3(N-1)/N·Ψ with resharding (root gathered once), 2(N-1)/N·Ψ without. The MLP's root
    keeps no parameter (every Linear is a unit, the only other one is frozen)."""
    _, ledger, _, numels = minidist.launch(
        train_on_rank, world, name, reshard_after_forward=reshard
    )[0]
    expected = theory.bytes_sent_per_step(numels, world, reshard, has_root=name == "gpt")
    got = training_bytes(ledger)
    assert got["all_gather"] == pytest.approx(expected["all_gather"])
    assert got["reduce_scatter"] == pytest.approx(expected["reduce_scatter"])
    assert got["all_reduce"] == 0


@pytest.mark.parametrize("world", [1, 2, 4])
def test_memory_per_rank_is_one_nth(world):
    model = build("gpt").model
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    _, _, mem, numels = minidist.launch(train_on_rank, world, "gpt")[0]
    expected = theory.sharded_state_bytes(numels, world)
    assert mem.params == expected["params"] + 4 * frozen  # every unit resharded after step
    assert mem.grads == expected["grads"]
    assert mem.optimizer == expected["optimizer"]


class Scaled(nn.Module):
    """A unit with a single element: fewer than the ranks, so most chunks are padding."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([1.5]))

    def forward(self, x):
        return x * self.scale


def tiny_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 3), Scaled(), nn.Linear(3, 2))


def tiny_rank(max_norm):
    rank, world = dist.get_rank(), dist.get_world_size()
    fsdp = FullyShardedDataParallel(tiny_model(), wrap=lambda m: isinstance(m, (Scaled, nn.Linear)))
    opt = torch.optim.Adam(fsdp.sharded_parameters(), **ADAM)
    g = torch.Generator().manual_seed(0)
    norms = []
    for _ in range(3):
        x, y = torch.randn(8, 5, generator=g), torch.randn(8, 2, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(
            fsdp(shard_batch((x,), rank, world)[0]), shard_batch((y,), rank, world)[0]
        ).backward()
        norms.append(fsdp.clip_grad_norm_(max_norm))
        opt.step()
    chunks = [u.shard.numel() for u in fsdp.units]
    return fsdp.full_state_dict(), norms, chunks


def test_units_smaller_than_the_world_and_clipping_across_shards():
    model = tiny_model()
    opt = torch.optim.Adam(model.parameters(), **ADAM)
    g = torch.Generator().manual_seed(0)
    ref_norms = []
    for _ in range(3):
        x, y = torch.randn(8, 5, generator=g), torch.randn(8, 2, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        ref_norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), 0.1)))
        opt.step()
    results = minidist.launch(tiny_rank, 4, 0.1)
    state, norms, chunks = results[0]
    # innermost units first: Linear(3, 2) 8 elements -> 2 each; the scale, 1 element on 4
    # ranks -> 1 (3 ranks hold padding only); Linear(5, 3) 18 -> 5
    assert chunks == [2, 1, 5]
    assert max(ref_norms) > 0.1  # clipping happened
    assert norms == pytest.approx(ref_norms, rel=1e-5)
    assert max_abs_diff(state, model.state_dict()) < PARAM_TOL
    assert tiny_model().load_state_dict(state) is not None  # strict: every name there
    assert all(r[0] == {} for r in results[1:])  # the full state dict lands on rank 0 only


def test_no_sync_accumulates_then_reduces_once():
    ref = accumulated_reference(3, "gpt")
    fsdp = partial(FullyShardedDataParallel, wrap=UNITS["gpt"])
    grads, ops = minidist.launch(accumulate_on_rank, 2, 3, "gpt", fsdp)[0]
    assert max_abs_diff(grads, ref) < GRAD_TOL
    assert ops.count("reduce_scatter") == 3  # one per unit, after the last micro-batch only


def gathered_rank():
    model, batches, loss_fn = build("gpt", layers=4)
    fsdp = FullyShardedDataParallel(model, wrap=UNITS["gpt"])
    peak = []

    def count(*_):
        peak.append(sum(u.gathered or u.pending_gather is not None for u in fsdp.units))

    for m in model.modules():
        if isinstance(m, Block):
            m.register_forward_hook(count)
    x, y = shard_batch(batches[0], dist.get_rank(), dist.get_world_size())
    for _ in range(2):  # the second step prefetches (it knows the order)
        peak.clear()
        loss_fn(fsdp(x), y).backward()
    return max(peak), len(fsdp.units)


def test_prefetch_keeps_at_most_two_units_besides_the_root():
    most, units = minidist.launch(gathered_rank, 2)[0]
    assert units == 5 and most <= 3  # root + the running block + one prefetched


def hybrid_rank():
    return train_on_rank("gpt", hybrid_shard_size=2)


def test_hybrid_sharding_equals_reference_with_theory_bytes_and_memory():
    ref = reference("gpt")
    results = minidist.launch(hybrid_rank, 4)
    model = build("gpt").model
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    for trace, ledger, mem, numels in results:
        assert max_abs_diff(trace.params, ref.params) < PARAM_TOL
        expected = theory.bytes_sent_per_step(numels, 4, True, shard_size=2)
        got = training_bytes(ledger)
        assert got == pytest.approx(expected)
        sizes = {r.group_size for r in ledger.records if r.tag != "full-state"}
        assert sizes == {2}  # shard groups of 2, replica groups of 4/2 = 2
        assert mem.params == theory.sharded_state_bytes(numels, 2)["params"] + 4 * frozen


def test_bad_input_is_named():
    def twice():
        model = nn.Sequential(nn.Linear(2, 2))
        FullyShardedDataParallel(model)
        FullyShardedDataParallel(model)

    with pytest.raises(minidist.RankFailedError, match="already an FSDP unit: wrap it once"):
        minidist.launch(twice, 2)

    def hybrid():
        FullyShardedDataParallel(nn.Linear(2, 2), hybrid_shard_size=3)

    with pytest.raises(
        minidist.RankFailedError, match="hybrid_shard_size=3 must be >= 1 and divide"
    ):
        minidist.launch(hybrid, 2)

    def tied_across_units():  # the tie goes to the unit around both (tests/test_own_models.py)
        a, b = nn.Linear(2, 2), nn.Linear(2, 2)
        b.weight = a.weight
        model = nn.Sequential(a, b)
        fsdp = FullyShardedDataParallel(model, wrap=lambda m: isinstance(m, nn.Linear))
        return {n: u.module is model for u in fsdp.units for n in u.names}

    assert minidist.launch(tied_across_units, 2)[0] == {
        "0.bias": False,
        "1.bias": False,
        "0.weight": True,
    }


def synced_accumulation_rank(micro_batches: tuple[int, ...]):
    """Per (k, reshard): k backward passes, each synced (no `no_sync`), before any step."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for k in micro_batches:
        for reshard in (True, False):
            model, batches, loss_fn = build("gpt", steps=k)
            fsdp = FullyShardedDataParallel(model, wrap=UNITS["gpt"], reshard_after_forward=reshard)
            for batch in batches:
                x, y = shard_batch(batch, rank, world)
                loss_fn(fsdp(x), y).backward()
            out[k, reshard] = fsdp.full_grads()
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_synced_backwards_before_step_sum_their_gradients(world):
    """Gradient accumulation without `no_sync`: each backward reduce-scatters, and the
    shards' gradients add up (as FSDP2's do), the last backward does not replace the others."""
    ks = (1, 2, 3)
    got = minidist.launch(synced_accumulation_rank, world, ks)
    for k in ks:
        ref = accumulated_reference(k, "gpt")
        for grads in got:
            for reshard in (True, False):
                assert max_abs_diff(grads[k, reshard], ref) < GRAD_TOL * k
