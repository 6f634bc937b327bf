"""3D parallelism (t=2 × p=2 × d=2, ZeRO-1 over d) on 8 ranks equals one process."""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from worlds import HUNG_S

import minidist
from minidist.data import shard_batch
from minidist.data_parallel.fixture import build
from minidist.three_d.run import GPT_3D, reference_losses, train_3d
from minidist.training import make_optimizer, max_abs_diff, train
from minidist.zero.optimizer import ZeroRedundancyOptimizer

# float32 with SGD + momentum: tensor-parallel all-reduces, micro-batch accumulation and the
# data-parallel reduce-scatter each sum in another order than one process (a few ulps per
# step); over 20 steps the losses stay within 1e-5 (measured 5e-7).
LOSS_TOL, PARAM_TOL = 1e-5, 1e-5


def test_3d_run_equals_one_process():
    model, batches, loss_fn = build("gpt", **GPT_3D)
    ref = train(model, batches, loss_fn, make_optimizer(model.parameters()))
    results = minidist.launch(train_3d, 8, timeout_s=300, idle_s=HUNG_S)
    assert results[0]["losses"] == pytest.approx(reference_losses(), abs=LOSS_TOL)
    for r in results:
        assert r["losses"] == results[0]["losses"]  # every rank reports the same curve
        assert max_abs_diff(r["params"], ref.params) < PARAM_TOL
    grids = {tuple(r["grid"]["tp"]) for r in results}
    assert grids == {(0, 1), (2, 3), (4, 5), (6, 7)}  # tensor parallel on neighbours


def zero1_rank():
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build("mlp")
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-2)
    for x, y in batches:
        opt.zero_grad()
        loss_fn(
            model(*shard_batch((x,), rank, world)), shard_batch((y,), rank, world)[0]
        ).backward()
        opt.step()
    state = sum(t.numel() for s in opt.state.values() for t in s.values() if t.dim())
    return {n: p.detach().clone() for n, p in model.named_parameters()}, state, opt.shard.numel()


def test_zero_redundancy_optimizer_equals_one_process_with_1_nth_of_the_state():
    model, batches, loss_fn = build("mlp")
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ref = train(model, batches, loss_fn, opt)
    for params, state, chunk in minidist.launch(zero1_rank, 4):
        assert max_abs_diff(params, ref.params) < 1e-4  # Adam: see tests/test_zero.py
        assert state == 2 * chunk  # exp_avg and exp_avg_sq of this rank's chunk only


def test_zero_redundancy_optimizer_needs_parameters():
    def rank_fn():
        ZeroRedundancyOptimizer([nn.Parameter(torch.ones(1), requires_grad=False)])

    with pytest.raises(minidist.RankFailedError, match="no trainable parameters"):
        minidist.launch(rank_fn, 2)


def stage_blocks_rank(layer_counts):
    """On a rank of a pipeline of 3: per layer count, the blocks of this rank's stage as the
    3D stage, lesson 09's `split_gpt` and `theory.stage_layers` deal them, and the 3D
    stage's parameter count."""
    from minidist.megatron import ParallelLayout
    from minidist.pipeline import split_gpt
    from minidist.three_d import theory
    from minidist.three_d.stage import split_tensor_parallel_gpt

    layout = ParallelLayout(tp=1, pp=3)
    out = {}
    for layers in layer_counts:
        dense = build("gpt", layers=layers).model
        stage = split_tensor_parallel_gpt(dense, layout)
        out[layers] = dict(
            three_d=list(stage.held),
            pipeline=list(split_gpt(dense, 3, layout.pp_rank).held),
            theory=list(theory.stage_layers(layers, 3)[layout.pp_rank]),
            params=sum(p.numel() for p in stage.parameters()),
        )
    return out


def test_layers_that_do_not_divide_by_the_stages_are_dealt_alike():
    """5 layers on 3 stages (and 3..8): the 3D stage, lesson 09's stage and the theory give
    every stage the same blocks, and the theory counts the 3D stage's parameters."""
    from minidist.three_d import theory

    counts = range(3, 9)
    results = minidist.launch(stage_blocks_rank, 3, counts)
    for layers in counts:
        dealt = [r[layers]["three_d"] for r in results]
        assert sorted(b for blocks in dealt for b in blocks) == list(range(layers))
        assert max(map(len, dealt)) - min(map(len, dealt)) <= 1  # as even as possible
        cfg = build("gpt", layers=layers).model.cfg
        for stage, r in enumerate(results):
            got = r[layers]
            assert got["three_d"] == got["pipeline"] == got["theory"]
            assert got["params"] == theory.params_per_rank(
                stage, 3, layers, cfg.hidden, cfg.vocab_size, cfg.seq_len, 1
            )


@pytest.mark.parametrize("tp, pp", [(1, 1), (1, 2), (2, 1)])
def test_memory_and_bytes_per_rank_equal_the_theory_on_small_layouts(tp, pp):
    """On 2 ranks, the layouts the 8-rank run does not have: one stage holding both the
    embedding and the head (their one shared copy), pipelines without tensor parallelism
    and d = 2 replicas under ZeRO-1 (its fp32 chunk, gradient chunk and momentum)."""
    from minidist.three_d.fixture import measured_on_rank, theory_for

    for r in minidist.launch(measured_on_rank, 2, tp, pp):
        want = theory_for(r["stage"], tp, pp, 2 // (tp * pp))
        assert r["numel"] == want["params"]
        assert r["trainable"] == want["trainable"]
        assert r["memory"] == want["memory"]
        for kind in ("tp", "pp", "dp"):
            assert r["sent"][kind] == pytest.approx(want["sent"][kind])
        assert r["sent"]["other"] == 0
