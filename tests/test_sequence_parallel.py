"""Sequence parallelism (lesson 14) equals the dense GPT and tensor parallelism; its ledger,
bytes and saved activations equal the theory (Korthikanti et al. 2022, section 4.2.2)."""

from collections import Counter

import pytest
import torch
import torch.distributed as dist

import minidist
from minidist.megatron.fixture import STEPS, build_dense, compare, matches, reference
from minidist.megatron.model import TensorParallelGPT
from minidist.megatron.sequence import (
    gather_from_sequence,
    linear_with_sequence_gather,
    reduce_scatter_to_sequence,
)
from minidist.models import GPTConfig
from minidist.sequence_parallel import theory
from minidist.sequence_parallel.fixture import layer_terms_on_rank, train_on_rank

# Tolerances: lesson 07's (the fixture's LOSS_TOL, GRAD_TOL, PARAM_TOL): the reduce-scatter
# sums the same t partial products as the all-reduce, in another order than one matmul.


@pytest.fixture(scope="module")
def ref():
    return reference()


@pytest.mark.parametrize("tp", [2, 4])
def test_sequence_parallel_gpt_equals_the_dense_gpt_and_its_ledger_the_theory(tp, ref):
    runs = minidist.launch(train_on_rank, tp, True)
    for run in runs:
        assert matches(compare(run.trace, ref)), compare(run.trace, ref)
    model, batches, _ = build_dense()
    cfg = model.cfg
    b, s = batches[0][0].shape
    records = runs[0].records
    # Lesson 07's f and g are gone: each region's all-reduce is a reduce-scatter plus an
    # all-gather along the sequence.
    tags = Counter((r.op, r.tag) for r in records)
    assert not any(tag.startswith("tp-f") or tag.startswith("tp-g") for _, tag in tags)
    per_step = {k: v / STEPS for k, v in tags.items()}
    regions = 2 * cfg.layers + 1
    assert per_step[("reduce_scatter", "sp-reduce-scatter-forward")] == regions
    assert per_step[("all_gather", "sp-gather-forward")] == regions
    assert per_step[("reduce_scatter", "sp-gather-backward")] == regions
    assert per_step[("all_gather", "sp-reduce-scatter-backward")] == regions
    assert per_step[("all_gather", "sp-regather-backward")] == 2 * cfg.layers
    sent = sum(r.ring_bytes for r in records) / STEPS
    assert sent == pytest.approx(
        theory.bytes_sent_per_step(cfg.layers, b, s, cfg.hidden, tp, runs[0].replicated_trainable)
    )
    # The activations' part equals tensor parallelism's all-reduces, byte for byte.
    tp_runs = minidist.launch(train_on_rank, tp, False)
    act = [r for r in records if r.tag.startswith("sp-") and r.tag != "sp-regather-backward"]
    act = [r for r in act if r.tag != "sp-replicated-grad"]
    tp_act = [r for r in tp_runs[0].records if r.tag.startswith("tp-f") or r.tag.startswith("tp-g")]
    assert sum(r.ring_bytes for r in act) == pytest.approx(sum(r.ring_bytes for r in tp_act))


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_saved_activations_per_rank_equal_the_theory_term_by_term(tp):
    cfg = build_dense().model.cfg
    b = 8
    for sp in (False, True):
        per_rank = minidist.launch(layer_terms_on_rank, tp, b, sp)
        want = theory.activation_terms(cfg.seq_len, b, cfg.hidden, cfg.heads, tp, sp)
        for got in per_rank:
            assert {k: got[k] for k in want} == want
            assert got["total"] == sum(want.values())
    # Korthikanti's summary: with SP every term is split t ways, TP alone keeps 10·sbh whole.
    paper_tp = theory.korthikanti_terms(cfg.seq_len, b, cfg.hidden, cfg.heads, tp, False)
    paper_sp = theory.korthikanti_terms(cfg.seq_len, b, cfg.hidden, cfg.heads, tp, True)
    sbh = cfg.seq_len * b * cfg.hidden
    assert sum(paper_tp.values()) == pytest.approx(
        sbh * (10 + 24 / tp + 5 * cfg.heads * cfg.seq_len / (cfg.hidden * tp))
    )
    assert sum(paper_sp.values()) == pytest.approx(
        sbh * (34 / tp + 5 * cfg.heads * cfg.seq_len / (cfg.hidden * tp))
    )


def _ops_rank(shapes):
    """Each op against its definition on the whole sequence, forward and backward."""
    n, r = dist.get_world_size(), dist.get_rank()
    worst = 0.0
    for i, (b, s, h) in enumerate(shapes):
        g = torch.Generator().manual_seed(i)
        full = [torch.randn(b, s, h, generator=g, dtype=torch.float64) for _ in range(n)]
        up = torch.randn(b, s, h, generator=g, dtype=torch.float64)
        mine = full[r].clone().requires_grad_()
        out = reduce_scatter_to_sequence(mine, None)  # forward: sum, this rank's block
        block = s // n
        want = sum(full)[:, r * block : (r + 1) * block]
        out.backward(up[:, r * block : (r + 1) * block])
        # backward: every rank's block of the upstream gradient, gathered
        worst = max(worst, float((out - want).abs().max()), float((mine.grad - up).abs().max()))
        part = full[r][:, r * block : (r + 1) * block].clone().requires_grad_()
        gathered = gather_from_sequence(part, None)
        want = torch.cat([f[:, k * block : (k + 1) * block] for k, f in enumerate(full)], 1)
        gathered.backward(up * (r + 1))  # backward: the sum of every rank's gradient block
        total = sum(up * (k + 1) for k in range(n))[:, r * block : (r + 1) * block]
        worst = max(worst, float((gathered - want).abs().max()))
        worst = max(worst, float((part.grad - total).abs().max()))
        w = torch.randn(3, h, generator=g, dtype=torch.float64, requires_grad=True)
        bias = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)
        part.grad = None
        y = linear_with_sequence_gather(part, w, bias, None)
        y_ref = torch.nn.functional.linear(want, w.detach(), bias.detach())
        y.backward(torch.ones_like(y))
        worst = max(worst, float((y - y_ref).abs().max()))
        worst = max(worst, float((part.grad - n * w.detach().sum(0)).abs().max()))
        worst = max(worst, float((w.grad - want.sum((0, 1)).expand(3, h)).abs().max()))
    return worst


@pytest.mark.parametrize("n", [2, 3])
def test_sequence_ops_equal_their_definitions_on_uneven_shapes(n):
    shapes = [(1, n, 1), (2, 2 * n, 3), (3, 5 * n, 7)]
    assert max(minidist.launch(_ops_rank, n, shapes)) < 1e-12


def _refused_rank(seq_len):
    model = build_dense(seq_len=seq_len).model
    try:
        TensorParallelGPT(model, None, sequence_parallel=True)
    except ValueError as e:
        return str(e)
    return None


def test_a_sequence_that_does_not_divide_by_tp_is_refused_by_name():
    msgs = minidist.launch(_refused_rank, 4, 18)
    assert all("sequence length 18 is not divisible by tp=4" in m for m in msgs)


def _eval_rank():
    torch.manual_seed(0)
    from minidist.models import GPT

    dense = GPT(GPTConfig(vocab_size=30, seq_len=16, heads=4, hidden=32, dropout=0.5))
    sp = TensorParallelGPT(dense, None, sequence_parallel=True).eval()
    dense.eval()
    idx = torch.randint(0, 30, (2, 16), generator=torch.Generator().manual_seed(3))
    logits = sp(idx)
    start = sp.module.tok_emb.start
    want = dense(idx)[..., start : start + logits.shape[-1]]
    return float((logits - want).abs().max())


def test_eval_mode_has_no_dropout_and_equals_the_dense_gpt():
    assert max(minidist.launch(_eval_rank, 2)) < 1e-5


def test_bench_report_says_when_torch_is_unavailable_and_compares_losses_otherwise():
    from minidist.megatron.lesson import ab_report

    down = ab_report("sp", [{"torch_error": "X: no rule", "ms_ours": 2.0}], 2, 10)
    assert down["sp_torch_baseline"] == "unavailable" and down["sp_torch_error"] == "X: no rule"
    up = [
        dict(ratio=0.5, ms_ours=1.0, ms_torch=2.0, loss_ours=1.0, loss_torch=1.0 + d)
        for d in (0.0, 1e-3)
    ]
    report = ab_report("sp", up, 2, 10)
    assert report["sp_step_ratio_vs_torch"] == 0.5 and report["sp_same_loss"] is False
    assert report["sp_loss_max_abs_diff"] == pytest.approx(1e-3)


@pytest.mark.parametrize("bad", [0, -2, 2.0, True, None])
def test_the_theory_refuses_a_tp_that_is_not_a_positive_int_by_name(bad):
    calls = (
        lambda: theory.bytes_sent_per_step(2, 1, 4, 8, bad),
        lambda: theory.korthikanti_terms(4, 1, 8, 2, bad, True),
        lambda: theory.activation_terms(4, 1, 8, 2, bad, True),
    )
    for call in calls:
        with pytest.raises(ValueError, match=f"tp must be a positive int, got {bad!r}"):
            call()
