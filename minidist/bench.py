"""Benchmarks: a minidist technique against its torch-native equivalent, in one run.

The harness runs the two sides *interleaved* on the same world (A then B, then B then A,
...), each round timing a few steps after a barrier, and reports the median of the per-round
ratios, so drift in the machine's speed hits both sides alike. Each figure is printed as one
`name=value` line, easy to grep in CI logs and to paste into an issue.

Speed goals live here, never in tests: a timed assertion on a shared 2-core machine fails
for reasons that have nothing to do with the code.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .runtime import launch


@dataclass
class ABResult:
    seconds_a: list[float]  # per round, per step
    seconds_b: list[float]

    @property
    def ratio(self) -> float:
        """Median over rounds of A's step time divided by B's."""
        return statistics.median(a / b for a, b in zip(self.seconds_a, self.seconds_b))


def interleaved_ab(
    step_a: Callable[[], None], step_b: Callable[[], None], rounds: int, steps: int, warmup: int = 2
) -> ABResult:
    """Time `steps` calls of each side per round, alternating which side goes first.

    Call it on every rank of a world (the barriers keep ranks in step); the times are this
    rank's.
    """
    for _ in range(warmup):
        step_a()
        step_b()
    result = ABResult([], [])
    for r in range(rounds):
        order = [(step_a, result.seconds_a), (step_b, result.seconds_b)]
        for step, out in order if r % 2 == 0 else order[::-1]:
            if dist.is_initialized():
                dist.barrier()
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            out.append((time.perf_counter() - t0) / steps)
    return result


def _ddp_rank(rounds: int, steps: int, bucket_cap_mb: float) -> dict:
    from torch.nn.parallel import DistributedDataParallel

    from .data_parallel import BucketedDataParallel
    from .data_parallel.timeline import step_timeline
    from .models import GPT, GPTConfig, lm_loss

    cfg = GPTConfig(vocab_size=256, seq_len=64, layers=4, heads=4, hidden=192)
    torch.manual_seed(0)
    ours_model, torch_model = GPT(cfg), GPT(cfg)
    torch_model.load_state_dict(ours_model.state_dict())
    ours = BucketedDataParallel(ours_model, bucket_cap_mb=bucket_cap_mb)
    native = DistributedDataParallel(torch_model, bucket_cap_mb=bucket_cap_mb)
    opt_ours = torch.optim.SGD(ours_model.parameters(), lr=0.01)
    opt_native = torch.optim.SGD(torch_model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(dist.get_rank())
    idx = torch.randint(cfg.vocab_size, (8, cfg.seq_len), generator=g)

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


def bench_ddp(world_size: int, rounds: int, steps: int) -> dict[str, float]:
    """minidist's BucketedDataParallel vs torch DDP: same GPT, world, bucket cap and data."""
    r = launch(_ddp_rank, world_size, rounds, steps, 1.0, timeout_s=1800)[0]
    return {
        "ddp_step_ratio_vs_torch": r["ratio"],
        "ddp_step_ms_minidist": r["ms_ours"],
        "ddp_step_ms_torch": r["ms_torch"],
        "ddp_overlap": r["overlap"],
        "ddp_buckets": r["buckets"],
        "ddp_params": r["params"],
        "world_size": world_size,
    }


BENCHES: dict[str, Callable[[int, int, int], dict[str, float]]] = {"ddp": bench_ddp}


def run_bench(name: str, world_size: int, rounds: int, steps: int) -> int:
    if name not in BENCHES:
        raise SystemExit(f"bench: unknown name {name!r}; choose one of {sorted(BENCHES)}")
    for key, value in BENCHES[name](world_size, rounds, steps).items():
        print(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    return 0
