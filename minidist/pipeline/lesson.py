"""Lesson 09's entries in the harnesses: the "pipeline GPipe" and "pipeline 1F1B" tour rows
and the `pp` bench.

- "pipeline 1F1B": `PipelineParallel` with the 1F1B schedule (Narayanan et al. 2021,
  PipeDream-Flush) on p = the tour's world (at most the GPT's 4 layers), m = 8 micro-batches,
  against the GPT in one process. Memory: rank 0's peak saved-activation bytes against
  `theory.peak_microbatches(0, p, m) × saved_per_microbatch` (what one micro-batch's forward
  saved on that stage, measured). Bytes: what rank 0 sends per step (activations forward,
  gradients backward, the tied embedding's all-reduce) against
  `theory.p2p_bytes_sent_per_step`, the loss's broadcast and the comparison contract's
  gathers (tags "pp-loss", "full-state") left out. The last step's measured Gantt chart goes
  to `pipeline_1f1b_timeline.png`.
- "pipeline GPipe": the same with GPipe's schedule (Huang et al. 2019, section 2.2): every
  forward, then every backward; the same bytes, and m micro-batches' activations alive on
  every stage (`theory.peak_microbatches(0, p, m, "gpipe")`).
- `pp` bench: minidist's 1F1B against `torch.distributed.pipelining`'s `Schedule1F1B` on the
  same two-stage split of a GPT (world of 2, same micro-batches, same data, SGD), timed
  interleaved; and the bubble of minidist's run measured from its timestamps next to the
  formula (p-1)/(m+p-1).
"""

from __future__ import annotations

import copy
import statistics
from pathlib import Path

import torch

from .. import comm
from ..bench import interleaved_ab
from ..megatron.layout import ParallelLayout
from ..models import lm_loss
from ..registry import TourRow, bench, tour_row
from ..runtime import launch
from ..training import max_abs_diff
from . import theory
from .engine import PipelineParallel, split_gpt
from .fixture import LOSS_TOL, PARAM_TOL, PP_GPT, build_pp, pipeline_on_rank, reference
from .simulate import from_timestamps

TOUR_M = 8  # micro-batches of the tour row (the batch of 8 sequences: one each)


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


@tour_row("pipeline GPipe", lesson=9)
def pipeline_gpipe_row(world_size: int, out_dir: Path) -> TourRow:
    return _pipeline_row("gpipe", "GPipe", world_size, out_dir)


@tour_row("pipeline 1F1B", lesson=9)
def pipeline_1f1b_row(world_size: int, out_dir: Path) -> TourRow:
    return _pipeline_row("1f1b", "1F1B", world_size, out_dir)


def _pipeline_row(kind: str, label: str, world_size: int, out_dir: Path) -> TourRow:
    from .plots import plot_measured_gantt

    model, batches, _ = build_pp()
    cfg = model.cfg
    p = max(1, min(world_size, cfg.layers))
    ref = reference()
    runs = launch(pipeline_on_rank, p, kind, TOUR_M, p)
    diffs = [max_abs_diff(r["params"], ref.params) for r in runs]
    losses_ok = all(
        max(abs(a - b) for a, b in zip(r["losses"], ref.losses)) < LOSS_TOL for r in runs
    )
    b, s = batches[0][0].shape
    r0 = runs[0]
    timings = [r["timings"] for r in runs]
    _save(
        plot_measured_gantt(timings, f"{label} measured, p = {p}, m = {TOUR_M}"),
        out_dir / f"pipeline_{kind}_timeline.png",
    )
    return TourRow(
        f"pipeline {label} (p={p}, m={TOUR_M})",
        losses_ok and max(diffs) < PARAM_TOL,
        max(diffs),
        memory_per_rank=r0["peak_bytes"],
        memory_theory=theory.peak_microbatches(0, p, TOUR_M, kind) * r0["per_mb"],
        bytes_per_rank=r0["sent_per_step"],
        bytes_theory=theory.p2p_bytes_sent_per_step(0, p, b, s, cfg.hidden, cfg.vocab_size),
    )


# -- bench: minidist's 1F1B vs torch.distributed.pipelining's Schedule1F1B -------------------

BENCH_M = 4  # micro-batches of the bench (its batch: 8 sequences)
BENCH_GPT = dict(PP_GPT, hidden=64, seq_len=32)
# float32, the same split and micro-batches on both sides: the losses after the same number
# of steps agree to float32 summation order
BENCH_LOSS_ATOL = 1e-4


def _tied_grad(stage) -> torch.Tensor | None:
    tied = stage.embedding if stage.first else stage.head
    return None if tied is None else tied.weight.grad


def _pp_bench_rank(rounds: int, steps: int) -> dict:
    import torch.distributed as dist

    dense, batches, loss_fn = build_pp(**BENCH_GPT)
    x, y = batches[0]
    layout = ParallelLayout(tp=1, pp=dist.get_world_size())
    rank, p = layout.pp_rank, layout.pp_size
    ours = PipelineParallel(copy.deepcopy(dense), loss_fn, layout, "1f1b", BENCH_M)
    ours.measure_activations = False  # the torch side measures nothing either
    opt_ours = torch.optim.SGD(ours.module.parameters(), lr=0.05, momentum=0.9)
    losses_ours: list[float] = []

    def step_ours() -> None:
        opt_ours.zero_grad(set_to_none=True)
        losses_ours.append(ours.train_step((x, y)))
        opt_ours.step()

    out: dict = {"params": sum(q.numel() for q in dense.parameters())}
    try:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        module = split_gpt(copy.deepcopy(dense), p, rank)
        stage = PipelineStage(module, rank, p, torch.device("cpu"))
        sched = Schedule1F1B(stage, n_microbatches=BENCH_M, loss_fn=lm_loss)
        opt_torch = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
        losses_torch: list[float] = []

        def step_torch() -> None:
            opt_torch.zero_grad(set_to_none=True)
            if rank == 0:
                sched.step(x)
            elif rank == p - 1:
                mb_losses: list = []
                sched.step(target=y, losses=mb_losses)
                losses_torch.append(float(torch.stack(mb_losses).detach().mean()))
            else:
                sched.step()
            tied = _tied_grad(module)
            if p > 1 and tied is not None:  # torch's stages do not know the weights are tied
                comm.all_reduce(tied, group=layout.group("embedding"))
            opt_torch.step()

        step_torch()  # fails here, before any timing, if the backend lacks something
    except Exception as e:  # any failure here means: no torch baseline on this machine
        out["torch_error"] = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
        ab = interleaved_ab(step_ours, lambda: None, rounds, steps)
        out["ms_ours"] = 1e3 * statistics.median(ab.seconds_a)
        step_torch = None
    if step_torch is not None:
        step_ours()  # the torch side took one extra step above: keep the two in step
        ab = interleaved_ab(step_ours, step_torch, rounds, steps)
        out |= {
            "ratio": ab.ratio,
            "ms_ours": 1e3 * statistics.median(ab.seconds_a),
            "ms_torch": 1e3 * statistics.median(ab.seconds_b),
            "loss_ours": losses_ours[-1],
            "loss_torch": losses_torch[-1] if losses_torch else None,
        }
    ours.timings = []  # one more step, timed step by step: the measured bubble
    step_ours()
    out["timings"] = ours.timings
    return out


@bench("pp")
def bench_pp(world_size: int, rounds: int, steps: int) -> dict[str, float]:
    """minidist's 1F1B vs torch's Schedule1F1B: same split GPT, micro-batches, data; p = 2."""
    p = 2  # the bench's pipeline: two stages (the world size asked for is not used)
    results = launch(_pp_bench_rank, p, rounds, steps, timeout_s=1800)
    measured = from_timestamps([r["timings"] for r in results]).bubble
    common = {
        "pp_bubble_measured": measured,
        "pp_bubble_theory": theory.bubble_fraction(p, BENCH_M, "1f1b"),
        "pp_microbatches": BENCH_M,
        "pp_params": results[0]["params"],
        "world_size": p,
    }
    r = results[0]
    if "torch_error" in r:
        return {
            "pp_torch_baseline": "unavailable",
            "pp_torch_error": r["torch_error"],
            "pp_step_ms_minidist": r["ms_ours"],
            **common,
        }
    last = results[-1]
    diff = abs(last["loss_ours"] - last["loss_torch"])
    return {
        "pp_step_ratio_vs_torch": r["ratio"],
        "pp_step_ms_minidist": r["ms_ours"],
        "pp_step_ms_torch": r["ms_torch"],
        "pp_same_loss": diff <= BENCH_LOSS_ATOL,
        "pp_loss_abs_diff": diff,
        "pp_loss": last["loss_torch"],
        **common,
    }
