"""The trainer's optimizer (issue 35): AdamW with weight decay on ndim ≥ 2 only, warm-up then
cosine or linear decay, and clipping by the global gradient norm, on lesson 17's engine.

The one-process run is torch's own (`torch.optim.AdamW` with two groups, `LambdaLR`,
`torch.nn.utils.clip_grad_norm_`). Tolerances: tests/test_compose.py's (fp32: losses 1e-5,
parameters 1e-3, a different reduction order; bf16: losses 1e-2, parameters 2·steps·lr),
and the norm before clipping within 1e-5 relative in fp32 (float32 sums in another order),
5e-2 in bf16 (bf16 gradients). Measured: fp32 losses ≤ 4.8e-7, norms ≤ 1.1e-6 absolute
(norms ≈ 1-2), parameters ≤ 2.8e-5. The weight decay (0.5 · lr per step) moves a norm's
weight of 1 by 2e-2 over the run, and a per-rank norm (no all-reduce, or every copy counted)
is off by ≥ 1/√2: each failure is far outside the tolerance.
"""

import math
from types import SimpleNamespace

import pytest
import torch
from micro_batches import lean_micro_batch
from worlds import HUNG_S

import minidist
from minidist.compose.fixture import reference, run_rank
from minidist.compose.optim import OptimizerConfig, lr_factor
from minidist.training import max_abs_diff

STEPS = 4
CFG = OptimizerConfig(
    "adamw", 1e-2, weight_decay=0.5, warmup=1, lr_schedule="cosine", min_lr=1e-3, clip_grad=0.5
)
LAYOUTS = [  # 4 ranks each; the six: tp with sp, pp with the tied embedding, cp, ep,
    ("llama", dict(dp_shard=2, tp=2, sp=True), "fp32"),  # HSDP, bf16
    ("gpt", dict(dp_shard=2, pp=2), "fp32"),
    ("llama", dict(cp=2, tp=2), "fp32"),
    ("moe", dict(dp_shard=4, ep=2), "fp32"),
    ("gpt", dict(dp_replicate=2, dp_shard=2), "fp32"),
    ("llama", dict(dp_shard=2, tp=2), "bf16"),
]


def _layouts() -> list[dict]:
    return [
        run_rank(m, dims, STEPS, 8, lean_micro_batch(dims), precision=p, optim=CFG)
        for m, dims, p in LAYOUTS
    ]


def test_the_schedule_warms_up_then_decays_to_min_lr_at_the_last_step():
    assert [lr_factor(s, 10, 3, "constant", 0.1) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(3, 10, 3, "cosine", 0.1) == 1.0
    assert lr_factor(9, 10, 3, "cosine", 0.1) == pytest.approx(0.1)
    assert lr_factor(6, 9, 3, "linear", 0.0) == pytest.approx(0.4)
    mid = lr_factor(6, 10, 3, "cosine", 0.0)
    assert mid == pytest.approx(0.5 * (1 + math.cos(math.pi * 3 / 6)))


def test_clipped_adamw_with_a_schedule_equals_torchs_on_six_layouts():
    want = {m: reference(m, STEPS, 8, optim=CFG) for m in ("llama", "gpt", "moe")}
    assert all(n > CFG.clip_grad for n in want["llama"]["norms"])  # clipping is on each step
    runs = minidist.launch(_layouts, 4, timeout_s=600, idle_s=HUNG_S)[0]
    for (model, dims, precision), got in zip(LAYOUTS, runs):
        ref = want[model]
        bf16 = precision == "bf16"
        tol = (
            dict(loss=1e-2, params=2 * STEPS * CFG.lr, norm=5e-2)
            if bf16
            else dict(loss=1e-5, params=1e-3, norm=1e-5)
        )
        assert got["losses"] == pytest.approx(ref["losses"], abs=tol["loss"]), dims
        assert got["norms"] == pytest.approx(ref["norms"], rel=tol["norm"]), dims
        assert max_abs_diff(got["params"], ref["params"]) < tol["params"], dims


def test_weight_decay_spares_norms_and_biases_in_one_process():
    plain = reference("gpt", 1, 8, optim=OptimizerConfig("adamw", 1e-2))  # one step: the
    # second would see the decayed matrices in its gradients
    decayed = reference("gpt", 1, 8, optim=OptimizerConfig("adamw", 1e-2, weight_decay=0.5))
    moved = {
        n for n in plain["params"] if not torch.equal(plain["params"][n], decayed["params"][n])
    }
    assert moved == {n for n, t in plain["params"].items() if t.dim() >= 2}


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(optimizer="sgd"), "--optimizer='sgd' must be one of"),
        (dict(lr_schedule="step"), "--lr-schedule='step' must be one of"),
        (dict(lr=0.0), "--lr=0.0 must be > 0"),
        (dict(min_lr=1.0), "--min-lr=1.0 must be in [0, --lr=0.01]"),
        (dict(weight_decay=-1.0), "--weight-decay=-1.0 must be >= 0"),
        (dict(warmup=5), "--warmup=5 must be >= 0 and < --steps=5"),
        (dict(clip_grad=0.0), "--clip-grad=0.0 must be > 0"),
        (dict(betas=(0.9, 1.0)), "--betas=0.9,1.0 must be two numbers B1,B2, each in"),
        (dict(betas=(-0.1, 0.9)), "--betas=-0.1,0.9 must be two numbers"),
        (dict(eps=0.0), "--eps=0.0 must be a finite number > 0"),
        (dict(eps=float("inf")), "--eps=inf must be a finite number > 0"),
        (dict(lr=float("inf")), "--lr=inf must be > 0 and finite"),
        (dict(lr=float("inf"), min_lr=float("inf")), "--lr=inf must be > 0 and finite"),
        (dict(weight_decay=float("inf")), "--weight-decay=inf must be >= 0 and finite"),
        (dict(clip_grad=float("inf")), "--clip-grad=inf must be > 0 and finite"),
        (dict(clip_grad=float("nan")), "--clip-grad=nan must be > 0 and finite"),
    ],
)
def test_bad_optimizer_options_are_refused_naming_the_option(options, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        OptimizerConfig(**options).check(5)


def _clip_two_ranks(max_norms: list[float]) -> list[tuple[float, list[float]]]:
    """Rank 0 owns [3, 4], rank 1 owns [12]; both hold a piece [84] that only rank 0 owns
    (a copy replicated over tp or dp_replicate): the whole gradient's norm is 85. One clip
    per max_norm, each on fresh gradients (one world for all)."""
    import torch.distributed as dist

    from minidist.compose.optim import clip_grad_norm_

    rank, out = dist.get_rank(), []
    for max_norm in max_norms:
        chunk = torch.tensor([3.0, 4.0]) if rank == 0 else torch.tensor([12.0])
        shared = torch.tensor([84.0])
        pieces = [
            SimpleNamespace(owner=True, tensor=chunk),
            SimpleNamespace(owner=rank == 0, tensor=shared),
        ]
        zero = SimpleNamespace(shard=SimpleNamespace(grad=chunk))
        engine = SimpleNamespace(optimizers=[([], zero)], grad_pieces=lambda held=pieces: held)
        out.append((clip_grad_norm_(engine, max_norm), chunk.tolist()))
    return out


def test_clipping_counts_each_piece_once_and_never_scales_up():
    """torch's `clip_grad_norm_` on the same three gradients in one process: a replicated
    piece counted on every rank that holds it gives 118.4, not 85; a norm below `max_norm`
    (1000) leaves the gradient as it is (the factor is clamped at 1), one above (8.5) scales
    it by 8.5 / 85."""
    max_norms = [1000.0, 8.5]
    ranks = minidist.launch(_clip_two_ranks, 2, max_norms, timeout_s=120)
    for i, max_norm in enumerate(max_norms):
        grads = [torch.tensor([3.0, 4.0]), torch.tensor([12.0]), torch.tensor([84.0])]
        params = [torch.zeros_like(g, requires_grad=True) for g in grads]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        want = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        assert [rank[i][0] for rank in ranks] == pytest.approx([want, want], rel=1e-6)
        assert ranks[0][i][1] == pytest.approx(params[0].grad.tolist(), rel=1e-6), max_norm
        assert ranks[1][i][1] == pytest.approx(params[1].grad.tolist(), rel=1e-6), max_norm
