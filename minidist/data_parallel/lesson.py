"""Lesson 01's entries in the harnesses: two tour rows and the `ddp` bench."""

from __future__ import annotations

import statistics
from pathlib import Path

import torch
import torch.distributed as dist

from .. import comm
from ..bench import interleaved_ab
from ..data import shard_batch
from ..memory import model_state_bytes
from ..registry import TourRow, bench, tour_row
from ..runtime import launch
from ..training import make_optimizer, max_abs_diff, train
from . import theory
from .fixture import build, trainable_params, wrap
from .timeline import step_timeline

# A GPT big enough for several buckets at these caps; 5 SGD steps on 16 sequences.
TOUR_MODEL = dict(steps=5, global_batch=16, seq_len=32, layers=2, heads=4, hidden=64)
TOUR_BUCKETS = dict(bucket_cap_mb=0.05, first_bucket_cap_mb=0.02)
# float32, the summation order is all that differs from one process (see the tests).
TOUR_TOL = 1e-5


def _tour_rank(kind: str):

    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build("gpt", **TOUR_MODEL)
    wrapped = wrap(kind, model, **TOUR_BUCKETS)
    local = [shard_batch(b, rank, world) for b in batches]
    opt = make_optimizer(model.parameters())
    with comm.record() as ledger:
        trace = train(wrapped, local, loss_fn, opt)
    timeline = step_timeline(wrapped, local[0], loss_fn, opt)
    memory = model_state_bytes(model, opt).total
    return trace.params, ledger.total_ring_bytes() / len(batches), memory, timeline


def _dp_row(kind: str, label: str, world_size: int, out_dir: Path) -> TourRow:
    from .plots import plot_timeline

    model, batches, loss_fn = build("gpt", **TOUR_MODEL)
    ref = train(model, batches, loss_fn, make_optimizer(model.parameters()))
    psi = trainable_params(model)
    n_params = sum(p.numel() for p in model.parameters())
    results = launch(_tour_rank, world_size, kind)
    diff = max(max_abs_diff(params, ref.params) for params, _, _, _ in results)
    fig = plot_timeline([r[3] for r in results], title=f"{kind} data parallel, {world_size} ranks")
    fig.savefig(out_dir / f"dp_{kind}_timeline.png", dpi=100, bbox_inches="tight")
    return TourRow(
        label,
        diff < TOUR_TOL,
        diff,
        memory_per_rank=results[0][2],
        memory_theory=theory.model_state_bytes_per_rank(n_params, psi, "sgd"),
        bytes_per_rank=results[0][1],
        bytes_theory=theory.bytes_sent_per_step(psi, world_size),
    )


@tour_row("naive DP", lesson=1)
def naive_dp_row(world_size: int, out_dir: Path) -> TourRow:
    return _dp_row("naive", "naive DP", world_size, out_dir)


@tour_row("bucketed DDP", lesson=1)
def bucketed_dp_row(world_size: int, out_dir: Path) -> TourRow:
    return _dp_row("bucketed", "bucketed DDP", world_size, out_dir)


# -- bench: BucketedDataParallel vs torch DDP ------------------------------------------------


def _ddp_bench_rank(rounds: int, steps: int, bucket_cap_mb: float) -> dict:
    from torch.nn.parallel import DistributedDataParallel

    from ..models import GPT, GPTConfig, lm_loss
    from .bucketed import BucketedDataParallel

    cfg = GPTConfig(vocab_size=256, seq_len=64, layers=4, heads=4, hidden=192)
    torch.manual_seed(0)
    ours_model, torch_model = GPT(cfg), GPT(cfg)
    torch_model.load_state_dict(ours_model.state_dict())
    ours = BucketedDataParallel(ours_model, bucket_cap_mb=bucket_cap_mb)
    native = DistributedDataParallel(torch_model, bucket_cap_mb=bucket_cap_mb)
    opt_ours = torch.optim.SGD(ours_model.parameters(), lr=0.01)
    opt_native = torch.optim.SGD(torch_model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(dist.get_rank())
    idx = torch.randint(cfg.vocab_size, (8, cfg.seq_len), device="cpu", generator=g)

    def step(model, opt):
        opt.zero_grad()
        lm_loss(model(idx), idx).backward()
        opt.step()

    ab = interleaved_ab(
        lambda: step(ours, opt_ours), lambda: step(native, opt_native), rounds, steps
    )
    overlaps = [step_timeline(ours, (idx, idx), lm_loss, opt_ours).overlap for _ in range(5)]
    return {
        "ratio": ab.ratio,
        "ms_ours": 1e3 * statistics.median(ab.seconds_a),
        "ms_torch": 1e3 * statistics.median(ab.seconds_b),
        "overlap": statistics.median(overlaps),
        "buckets": len(ours.buckets),
        "params": sum(p.numel() for p in ours_model.parameters()),
    }


@bench("ddp")
def bench_ddp(world_size: int, rounds: int, steps: int) -> dict[str, float]:
    """minidist's BucketedDataParallel vs torch DDP: same GPT, world, bucket cap and data."""
    r = launch(_ddp_bench_rank, world_size, rounds, steps, 1.0, timeout_s=1800)[0]
    return {
        "ddp_step_ratio_vs_torch": r["ratio"],
        "ddp_step_ms_minidist": r["ms_ours"],
        "ddp_step_ms_torch": r["ms_torch"],
        "ddp_overlap": r["overlap"],
        "ddp_buckets": r["buckets"],
        "ddp_params": r["params"],
        "world_size": world_size,
    }
