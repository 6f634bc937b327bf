"""Lesson 03's instruments: the unit timeline sees FSDP's schedule, the peak equals the theory."""

import pytest

import minidist
from minidist.fsdp import theory
from minidist.fsdp.lesson import hybrid_shard_size
from minidist.fsdp.timeline import peak_on_rank, timelines_on_rank

SMALL_GPT = dict(seq_len=16, layers=3, heads=2, hidden=32)


@pytest.mark.parametrize("world, f", [(1, 1), (2, 2), (3, 3), (4, 2), (6, 2), (9, 3)])
def test_hybrid_row_shards_over_the_smallest_proper_divisor(world, f):
    assert hybrid_shard_size(world) == f


@pytest.mark.parametrize("prefetch", [True, False])
def test_peak_parameter_memory_equals_the_theory(prefetch):
    runs = minidist.launch(peak_on_rank, 2, [1, 2, None], 4, prefetch)[0]
    for run in runs:
        expected = theory.peak_param_bytes(run["unit_numels"], 2, prefetch)
        assert run["shard_bytes"] == expected["shards"]
        assert run["peak_param_bytes"] == sum(expected.values()), run


def test_timeline_sees_each_unit_gathered_freed_and_reduced():
    with_prefetch, without = minidist.launch(
        timelines_on_rank, 2, [{}, {"prefetch": False}], SMALL_GPT
    )[0]
    for t, prefetch in ((with_prefetch, True), (without, False)):
        assert [u.name for u in t.units] == ["root", "blocks.0", "blocks.1", "blocks.2"]
        root, *blocks = t.units
        assert [g[2] for g in root.gathers] == ["forward"]  # kept from forward to backward
        assert len(root.frees) == len(root.reduce_scatters) == 1
        for u in blocks:
            assert [g[2] for g in u.gathers] == ["forward", "backward"]
            assert len(u.frees) == 2 and len(u.reduce_scatters) == 1
            assert u.forward and u.backward
            assert u.frees[0] >= u.forward[-1][1]  # freed after its forward compute
        prefetched = [g[3] for u in t.units for g in u.gathers]
        # root; then per block (forward, backward): each prefetched by the unit before it,
        # except the first unit of backward (the last block), which nothing precedes
        assert prefetched == (
            [False, True, True, True, True, True, False] if prefetch else [False] * 7
        )
        assert t.most_units_gathered == (3 if prefetch else 2)
