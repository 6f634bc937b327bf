"""Lesson 15's entries in the harnesses: the "context parallel" tour row and the `cp` bench.

- "context parallel (ring attention)": `ContextParallelGPT` (zig-zag split) on c = the
  tour's world (2 where the sequence does not divide into 2c chunks), against the dense GPT
  in one process; bytes per step against `theory.bytes_sent_per_step`; the memory column is
  what changes: one layer's saved activations per rank against the dense layer's / c.
- `cp` bench: ring attention against torch's `context_parallel` (DTensor's ring attention)
  on the same q, k, v. torch 2.13 has no CPU sharding rule for its CPU attention kernel, so
  on CPUs the bench reports the native side unavailable, with torch's message.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..bench import interleaved_ab
from ..megatron.fixture import STEPS, build_dense, compare, matches, reference
from ..registry import TourRow, bench, tour_row
from ..runtime import launch, rank_device
from . import theory
from .fixture import layer_activations_rank, train_on_rank
from .ring import ring_attention
from .split import positions


def tour_cp(world_size: int) -> int:
    seq = build_dense().model.cfg.seq_len
    return world_size if world_size >= 1 and seq % (2 * world_size) == 0 else 2


@tour_row("context parallel", lesson=15)
def context_parallel_row(world_size: int, out_dir: Path) -> TourRow:
    from .plots import plot_causal_work

    c = tour_cp(world_size)
    model, batches, _ = build_dense()
    cfg = model.cfg
    runs = launch(train_on_rank, c, "zigzag")
    diffs = [compare(run.trace, reference()) for run in runs]
    sent = sum(r.ring_bytes for r in runs[0].records) / STEPS
    b, s = batches[0][0].shape
    dense = launch(layer_activations_rank, 1)[0]
    fig = plot_causal_work(c)
    fig.savefig(out_dir / "cp_work.png", dpi=100, bbox_inches="tight")
    return TourRow(
        f"context parallel (c={c}, zig-zag; memory: activations/layer)",
        all(matches(d) for d in diffs),
        max(d["param"] for d in diffs),
        memory_per_rank=launch(layer_activations_rank, c)[0],
        memory_theory=dense // c,
        bytes_per_rank=sent,
        bytes_theory=theory.bytes_sent_per_step(cfg.layers, b, s, cfg.hidden, c, runs[0].trainable),
    )


BENCH = dict(batch=2, heads=8, seq=1024, dim=64)


def _cp_bench_rank(rounds: int, steps: int) -> dict:
    b, a, s, d = (BENCH[k] for k in ("batch", "heads", "seq", "dim"))
    c, r = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, a, s, d, device="cpu", generator=g).to(rank_device()) for _ in "qkv")
    pos = positions(s, c, r, "zigzag")
    mine = [t[:, :, pos].clone().requires_grad_() for t in (q, k, v)]

    def ours() -> None:
        ring_attention(*mine, None, "zigzag", s).sum().backward()

    out: dict = {}
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel

        mesh = init_device_mesh(rank_device().type, (c,))
        bufs = [t.clone() for t in (q, k, v)]

        def native() -> None:
            with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2, 2, 2]):
                F.scaled_dot_product_attention(*bufs, is_causal=True)

        native()  # fails here, before any timing, where torch has no rule for this kernel
    except Exception as e:  # any failure here means: no torch baseline on this machine
        out["torch_error"] = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
        ab = interleaved_ab(ours, lambda: None, rounds, steps)
        out["ms_ours"] = 1e3 * statistics.median(ab.seconds_a)
        return out
    ab = interleaved_ab(ours, native, rounds, steps)
    return out | {
        "ratio": ab.ratio,
        "ms_ours": 1e3 * statistics.median(ab.seconds_a),
        "ms_torch": 1e3 * statistics.median(ab.seconds_b),
    }


@bench("cp")
def bench_cp(world_size: int, rounds: int, steps: int) -> dict[str, float]:
    """Ring attention (zig-zag, forward + backward) vs torch's `context_parallel`."""
    r = launch(_cp_bench_rank, world_size, rounds, steps, timeout_s=1800)[0]
    if "torch_error" in r:
        return {
            "cp_torch_baseline": "unavailable",
            "cp_torch_error": r["torch_error"],
            "cp_step_ms_minidist": r["ms_ours"],
            "world_size": world_size,
        }
    return {
        "cp_step_ratio_vs_torch": r["ratio"],
        "cp_step_ms_minidist": r["ms_ours"],
        "cp_step_ms_torch": r["ms_torch"],
        "world_size": world_size,
    }
