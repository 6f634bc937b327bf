"""Megatron tensor parallelism equals the dense model; the layout follows Megatron-LM's rule."""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import minidist
from minidist import comm
from minidist.data_parallel.fixture import build
from minidist.megatron import ParallelLayout, TensorParallelGPT, parallel_groups, theory
from minidist.megatron.fixture import (
    GRAD_TOL,
    LOSS_TOL,
    PARAM_TOL,
    STEPS,
    build_dense,
    compare,
    dp_mean_losses,
    dropout_streams_on_rank,
    layout_train_on_rank,
    ledger_by_part_on_rank,
    memory_theory,
    reference,
    train_on_rank,
)
from minidist.megatron.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    gather_split,
    vocab_parallel_cross_entropy,
)
from minidist.megatron.ops import copy_to_tp

# Tolerances (LOSS_TOL, GRAD_TOL, PARAM_TOL) and the model (lesson 01's GPT with 4 heads:
# divisible by tp = 2 and 4, vocabulary 30 padded to 32 at tp = 4) are the fixture's.


def test_the_16_rank_example():
    g = parallel_groups(16, tp=2, pp=4)
    assert g["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]]
    assert g["pp"] == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    assert g["dp"] == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]
    assert g["mp"] == [[0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15]]
    assert g["embedding"] == [[0, 12], [1, 13], [2, 14], [3, 15]]


@pytest.mark.parametrize("world, tp, pp", [(8, 2, 2), (12, 3, 2), (8, 1, 8), (6, 6, 1)])
def test_every_rank_is_in_exactly_one_group_of_each_kind(world, tp, pp):
    g = parallel_groups(world, tp, pp)
    for kind, size in (("tp", tp), ("pp", pp), ("dp", world // (tp * pp)), ("mp", tp * pp)):
        assert sorted(r for group in g[kind] for r in group) == list(range(world))
        assert all(len(group) == size for group in g[kind])


@pytest.mark.parametrize(
    "args, words",
    [((16, 3, 2), "not divisible by tp·pp = 3·2"), ((8, 0, 1), "tp must be an int >= 1")],
)
def test_bad_layout_is_named(args, words):
    with pytest.raises(ValueError, match=words):
        parallel_groups(*args)


def layout_rank():
    layout = ParallelLayout(tp=2, pp=2)
    t = torch.tensor([float(dist.get_rank())])
    comm.all_reduce(t, group=layout.group("tp"))
    return layout.tp_rank, layout.pp_rank, layout.dp_rank, float(t), layout.mine


def test_layout_on_a_world_of_8():
    for rank, (tp_rank, pp_rank, dp_rank, tp_sum, mine) in enumerate(
        minidist.launch(layout_rank, 8)
    ):
        assert mine["tp"] == [rank - rank % 2, rank - rank % 2 + 1]
        assert tp_sum == sum(mine["tp"])  # the group really is those ranks
        assert (tp_rank, pp_rank, dp_rank) == (rank % 2, rank // 4, (rank % 4) // 2)


def layers_rank(seed: int):
    """Each split layer against its dense original, on the same input."""
    group, torch_gen = None, torch.Generator().manual_seed(seed)
    col, row = nn.Linear(6, 8), nn.Linear(8, 6)
    emb = nn.Embedding(30, 8)
    for m in (col, row, emb):
        for p in m.parameters():
            nn.init.normal_(p, generator=torch_gen)
    x = torch.randn(3, 6, generator=torch_gen, requires_grad=True)
    ids = torch.randint(30, (3, 5), generator=torch_gen)
    pc, pr, pe = (
        ColumnParallelLinear(col, group),
        RowParallelLinear(row, group),
        VocabParallelEmbedding(emb, group),
    )
    y = pr(pc(x).relu())
    out = pe(ids)
    logits = F.linear(copy_to_tp(out, group), pe.weight)  # the tied head, behind f
    loss = vocab_parallel_cross_entropy(logits, ids, group, pe.start, 30)
    (y.sum() + loss).backward()
    grads = {
        "col": gather_split(pc.weight.grad, pc.weight.tp_split, group),
        "row": gather_split(pr.weight.grad, pr.weight.tp_split, group),
        "emb": gather_split(pe.weight.grad, pe.weight.tp_split, group),
    }
    return y.detach(), out.detach(), loss.detach(), x.grad, grads


@pytest.mark.parametrize("tp", [2, 4])
def test_each_layer_equals_its_dense_original(tp):
    torch_gen = torch.Generator().manual_seed(0)
    col, row, emb = nn.Linear(6, 8), nn.Linear(8, 6), nn.Embedding(30, 8)
    for m in (col, row, emb):
        for p in m.parameters():
            nn.init.normal_(p, generator=torch_gen)
    x = torch.randn(3, 6, generator=torch_gen, requires_grad=True)
    ids = torch.randint(30, (3, 5), generator=torch_gen)
    y = row(col(x).relu())
    out = emb(ids)
    loss = F.cross_entropy(F.linear(out, emb.weight).reshape(-1, 30), ids.reshape(-1))
    (y.sum() + loss).backward()
    for got_y, got_out, got_loss, got_xgrad, grads in minidist.launch(layers_rank, tp, 0):
        assert torch.allclose(got_y, y, atol=1e-5) and torch.allclose(got_out, out)
        assert abs(float(got_loss - loss.detach())) < 1e-5  # full logits never formed on any rank
        assert torch.allclose(got_xgrad, x.grad, atol=1e-5)  # f all-reduced the input grad
        assert torch.allclose(grads["col"], col.weight.grad, atol=1e-5)
        assert torch.allclose(grads["row"], row.weight.grad, atol=1e-5)
        assert torch.allclose(grads["emb"], emb.weight.grad, atol=1e-5)


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_gpt_equals_the_dense_gpt(tp):
    model, batches, _ = build_dense()
    ref = reference()
    results = minidist.launch(train_on_rank, tp)
    cfg = model.cfg
    for run in results:
        diffs = compare(run.trace, ref)
        assert diffs["loss"] < LOSS_TOL and diffs["grad"] < GRAD_TOL
        assert diffs["param"] < PARAM_TOL
        # replicated parameters get bit-identical gradients on every tp rank
        first = results[0].replicated_grads
        assert all(torch.equal(g, first[n]) for n, g in run.replicated_grads.items())
        assert run.params == theory.params_per_rank(
            cfg.layers, cfg.hidden, cfg.vocab_size, cfg.seq_len, tp
        )  # split ones 1/t (vocab padded to 32), replicated ones whole
        # parameters + gradients + momentum, to the byte (the frozen ln_f.bias has neither)
        assert run.memory.total == memory_theory(tp)
    # vocab padding: the last rank's padding rows exist only at tp=4 and never get a gradient
    pads = [run.padding_grad for run in results]
    assert pads == ([None, None] if tp == 2 else [None, None, None, 0.0])
    # the ledger: exactly the all-reduces of the theory, and nothing else
    b, s = batches[0][0].shape
    expected = theory.all_reduces_per_step(cfg.layers, b, s, cfg.hidden)
    records = results[0].records
    assert {r.op for r in records} == {"all_reduce"}
    tags = [r.tag for r in records]
    assert tags.count("tp-g-forward") == STEPS * expected["forward"][0]
    assert tags.count("tp-f-backward") == STEPS * expected["backward"][0]
    sent = sum(r.ring_bytes for r in records) / STEPS
    assert sent == pytest.approx(theory.bytes_sent_per_step(cfg.layers, b, s, cfg.hidden, tp))


def test_ledger_by_part_is_two_and_two_per_layer():
    rows = minidist.launch(ledger_by_part_on_rank, 2)[0]
    model, batches, _ = build_dense()
    b, s = batches[0][0].shape
    h = model.cfg.hidden
    for i in range(model.cfg.layers):
        for phase, tag in (("forward", "tp-g-forward"), ("backward", "tp-f-backward")):
            mine = [r for r in rows if r[:2] == (f"block {i}", phase)]
            assert mine == [(f"block {i}", phase, tag, b * s * h)] * 2
    assert [r for r in rows if r[0] == "embedding"] == [
        ("embedding", "forward", "tp-g-forward", b * s * h)
    ]
    assert [r for r in rows if r[0] == "head"] == [("head", "backward", "tp-f-backward", b * s * h)]
    assert [(r[1], r[3]) for r in rows if r[0] == "loss"] == [("forward", b * s)] * 3


def test_tp_inside_dp_across_equals_the_dense_gpt():
    model, batches, _ = build_dense()
    cfg, (b, s) = model.cfg, batches[0][0].shape
    ref = reference()
    runs = minidist.launch(layout_train_on_rank, 4, 2)
    losses = dp_mean_losses(runs)
    for rank, run in enumerate(runs):
        assert run.coords == (rank % 2, rank // 2)  # TP inside (consecutive), DP across
        diffs = compare(run.trace, ref, losses)
        assert diffs["loss"] < LOSS_TOL and diffs["grad"] < GRAD_TOL
        assert diffs["param"] < PARAM_TOL
        assert run.memory.total == memory_theory(2)  # DP replicates: TP's memory at t=2
        groups = {r.group_ranks for r in run.records}
        assert groups == {tuple(run.mine["tp"]), tuple(run.mine["dp"])}
        sent = sum(r.ring_bytes for r in run.records) / STEPS
        assert sent == pytest.approx(
            theory.layout_bytes_sent_per_step(cfg.layers, b, s, cfg.hidden, 2, 2, run.trainable)
        )


def test_sizes_not_divisible_by_tp_are_named():
    def rank_fn():
        TensorParallelGPT(build("gpt", heads=2, hidden=32).model)  # heads=2 on tp=4

    with pytest.raises(minidist.RankFailedError, match="heads=2 is not divisible by tp=4"):
        minidist.launch(rank_fn, 4)


def test_dropout_rng_differs_inside_tp_regions_and_agrees_outside():
    (in0, out0), (in1, out1) = minidist.launch(dropout_streams_on_rank, 2)
    assert not torch.equal(in0[0], in1[0])  # each rank's heads get their own masks
    assert not torch.equal(in0[0], in0[1])  # and new ones at every call
    assert torch.equal(out0, out1)  # outside: the same on every tp rank, unaffected by fork
    torch.manual_seed(1)  # the fixture seeds the default generator with seed + 1
    assert torch.equal(out0, (torch.rand(out0.numel()) > 0.5).int())  # as if no fork happened


def block_activation_rank(b: int, s: int):
    from minidist.memory import SavedActivations

    model = build_dense().model
    tp = TensorParallelGPT(model)
    x = torch.zeros(b, s, model.cfg.hidden, requires_grad=True)
    with SavedActivations(tp) as saved:
        tp.module.blocks[0](x)
    return saved.bytes


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_activation_memory_per_rank_falls_with_tp_as_the_theory_says(tp):
    """Replicated outside the TP regions, split t ways inside (Korthikanti et al. 2022)."""
    cfg = build_dense().model.cfg
    measured = minidist.launch(block_activation_rank, tp, 8, cfg.seq_len)[0]
    assert measured == theory.activation_bytes_per_layer(8, cfg.seq_len, cfg.hidden, cfg.heads, tp)


# -- the contract over a range: logits far from zero, vocabularies that need padding, eval ----

CE_CASES = [(30, 0.0, 1.0), (30, 1e3, 30.0), (17, -2e3, 5.0), (33, 1e4, 100.0), (8, 300.0, 1.0)]


def large_logits_rank(cases):
    """Per (vocab, offset, spread): loss and logit gradient of the vocab-parallel cross
    entropy on this rank's columns, the full gradient gathered back."""
    t, r = dist.get_world_size(), dist.get_rank()
    out = []
    for vocab, offset, spread in cases:
        g = torch.Generator().manual_seed(vocab)
        full = offset + spread * torch.randn(3, 5, vocab, generator=g)
        targets = torch.randint(0, vocab, (3, 5), generator=g)
        per_rank = -(-vocab // t)
        padded = F.pad(full, (0, per_rank * t - vocab))  # padding columns: masked inside
        local = padded[..., r * per_rank : (r + 1) * per_rank].clone().requires_grad_()
        loss = vocab_parallel_cross_entropy(local, targets, None, r * per_rank, vocab)
        loss.backward()
        grad = torch.empty(t * local.numel())
        comm.all_gather(grad, local.grad.reshape(-1).contiguous())
        grad = torch.cat(grad.view(t, *local.shape).unbind(0), dim=-1)[..., :vocab]
        out.append((loss.detach(), grad))
    return out


@pytest.mark.parametrize("tp", [2, 4])
def test_vocab_parallel_cross_entropy_with_logits_far_above_88(tp):
    """exp overflows float32 above 88: the loss subtracts the global maximum first (one
    all-reduce MAX), so logits around ±10^3..10^4 give F.cross_entropy's loss and gradient."""
    for (vocab, offset, spread), (loss, grad) in zip(
        CE_CASES, minidist.launch(large_logits_rank, tp, CE_CASES)[0]
    ):
        g = torch.Generator().manual_seed(vocab)
        full = (offset + spread * torch.randn(3, 5, vocab, generator=g)).requires_grad_()
        targets = torch.randint(0, vocab, (3, 5), generator=g)
        ref = F.cross_entropy(full.view(-1, vocab), targets.view(-1))
        ref.backward()
        assert torch.isfinite(loss) and torch.isfinite(grad).all()
        # float32 logits of size |offset| round to ~6e-8·|offset|: the loss to 1e-6·|offset|
        tol = 1e-6 * max(1.0, abs(offset))
        assert float(loss) == pytest.approx(float(ref.detach()), abs=tol)
        assert (grad - full.grad).abs().max() < 1e-6 * max(1.0, abs(offset))


def eval_rank(dropout: float):
    """Logits of TensorParallelGPT on the first batch, in train() and in eval()."""
    model, batches, _ = build_dense(dropout=dropout)
    tp = TensorParallelGPT(model)
    x = batches[0][0]
    out = {}
    for mode in ("train", "eval"):
        getattr(tp, mode)()
        with torch.no_grad():
            local = tp(x)
        t = dist.get_world_size()
        full = torch.empty(t * local.numel())
        comm.all_gather(full, local.reshape(-1).contiguous())
        out[mode] = torch.cat(full.view(t, *local.shape).unbind(0), -1)[..., : model.cfg.vocab_size]
    return out


@pytest.mark.parametrize("tp", [2, 4])
def test_eval_mode_has_no_dropout_and_equals_the_dense_model_in_eval(tp):
    model, batches, _ = build_dense(dropout=0.5)
    x = batches[0][0]
    model.eval()
    with torch.no_grad():
        dense = model(x)
    for got in minidist.launch(eval_rank, tp, 0.5):
        assert (got["eval"] - dense).abs().max() < 1e-5
        assert (got["train"] - dense).abs().max() > 1e-2  # dropout is on in train()
