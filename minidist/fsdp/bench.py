"""The `zero` bench: minidist's sharded data parallelism against torch's, in one world.

Two pairs, each timed with `minidist.bench.interleaved_ab` on the same GPT, data and Adam:

- FSDP: `FullyShardedDataParallel` (one unit per `Block`, the root the rest, parameters freed
  after each unit's forward) vs FSDP2, `torch.distributed.fsdp.fully_shard` on every `Block`
  and on the root (over `init_device_mesh` of the ranks' device type: CPU under gloo).
- ZeRO-1: `ZeroDataParallel(stage=1)` with its `.optimizer` vs torch's composition of stage
  1, `DistributedDataParallel` + `ZeroRedundancyOptimizer(optimizer_class=Adam)`.

After the timed steps (both sides ran the same number, on the same batches) each pair
evaluates its loss on a fixed batch: a ratio between two different computations would be
worthless, so `<pair>_same_loss` says whether they still agree. A torch side that fails on
this machine (an unsupported backend, say) is reported as `<pair>_torch_baseline=unavailable`
with its error, and the minidist side is timed alone.

Registered through `minidist.fsdp.lesson` (which imports this module); `python -m minidist
bench zero --rounds 9`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from ..bench import interleaved_ab
from ..models import GPT, Block, GPTConfig, lm_loss
from ..registry import bench
from ..runtime import launch, rank_device

# The ddp bench's GPT (about 1.8M parameters).
CFG = dict(vocab_size=256, seq_len=64, layers=4, heads=4, hidden=192)
BATCH = 4  # sequences per rank: a step of ~100 ms on one thread per rank
ADAM = dict(lr=1e-3)
# float32 on both sides; only the summation order of the gradient reductions differs (and,
# for FSDP2, its pre/post division by N), which Adam turns into ~1e-6 relative parameter
# noise per step: the losses agree to ~1e-5 relative after ~100 steps. A different
# computation (a missed, doubled or unaveraged gradient, a skipped step) moves the loss
# by far more than 1e-3.
LOSS_RTOL = 1e-3


def _models(cfg: GPTConfig) -> tuple[GPT, GPT]:
    """Two identical GPTs (same initial weights on every rank)."""
    torch.manual_seed(0)
    ours, native = GPT(cfg).to(rank_device()), GPT(cfg).to(rank_device())
    native.load_state_dict(ours.state_dict())
    return ours, native


def _stepper(model: nn.Module, opt, idx: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        opt.zero_grad(set_to_none=True)
        lm_loss(model(idx), idx).backward()
        opt.step()

    return step


@torch.no_grad()
def _eval_loss(model: nn.Module, idx: torch.Tensor) -> float:
    return float(lm_loss(model(idx), idx))


def _native_fsdp(model: GPT):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(rank_device().type, (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, reshard_after_forward=True)
    return model, torch.optim.Adam(model.parameters(), **ADAM)


def _native_zero1(model: GPT):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(model)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, **ADAM)
    return ddp, opt


def _ours_fsdp(model: GPT):
    from .fully_sharded import FullyShardedDataParallel

    fsdp = FullyShardedDataParallel(
        model, wrap=lambda m: isinstance(m, Block), reshard_after_forward=True
    )
    return fsdp, torch.optim.Adam(fsdp.sharded_parameters(), **ADAM)


def _ours_zero1(model: GPT):
    from ..zero.sharded import ZeroDataParallel

    zero = ZeroDataParallel(model, stage=1, optimizer_class=torch.optim.Adam, **ADAM)
    return zero, zero.optimizer


def _pair(label: str, ours_fn, native_fn, cfg, idx, eval_idx, rounds, steps) -> dict:
    """Time one pair interleaved; fall back to minidist alone if torch's side fails here."""
    ours_model, native_model = _models(cfg)
    ours, opt_ours = ours_fn(ours_model)
    step_ours = _stepper(ours, opt_ours, idx)
    out: dict = {}
    try:
        native, opt_native = native_fn(native_model)
        step_native = _stepper(native, opt_native, idx)
        step_native()  # fails here, before any timing, if the backend lacks something
    except Exception as e:  # any failure here means: no torch baseline on this machine
        out[f"{label}_torch_baseline"] = "unavailable"
        out[f"{label}_torch_error"] = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
        step_ours()
        ab = interleaved_ab(step_ours, lambda: None, rounds, steps)
        out[f"{label}_step_ms_minidist"] = 1e3 * statistics.median(ab.seconds_a)
        return out
    step_ours()  # the native side took one extra step above: keep the two in step
    ab = interleaved_ab(step_ours, step_native, rounds, steps)
    loss_ours, loss_native = _eval_loss(ours, eval_idx), _eval_loss(native, eval_idx)
    out[f"{label}_step_ratio_vs_torch"] = ab.ratio
    out[f"{label}_step_ms_minidist"] = 1e3 * statistics.median(ab.seconds_a)
    out[f"{label}_step_ms_torch"] = 1e3 * statistics.median(ab.seconds_b)
    out[f"{label}_loss_minidist"] = loss_ours
    out[f"{label}_loss_torch"] = loss_native
    return out


def _zero_bench_rank(rounds: int, steps: int) -> dict:
    cfg = GPTConfig(**CFG)
    g = torch.Generator().manual_seed(dist.get_rank())
    idx, eval_idx = (
        torch.randint(cfg.vocab_size, (BATCH, cfg.seq_len), device="cpu", generator=g).to(
            rank_device()
        )
        for _ in range(2)
    )
    t0 = time.perf_counter()
    out = _pair("fsdp", _ours_fsdp, _native_fsdp, cfg, idx, eval_idx, rounds, steps)
    out |= _pair("zero1", _ours_zero1, _native_zero1, cfg, idx, eval_idx, rounds, steps)
    out["seconds"] = time.perf_counter() - t0
    out["params"] = sum(p.numel() for p in GPT(cfg).parameters())
    return out


def _same_loss(results: list[dict], label: str) -> bool | None:
    """Every rank's eval loss equal on both sides within LOSS_RTOL (None: no baseline)."""
    if f"{label}_loss_torch" not in results[0]:
        return None
    return all(
        abs(r[f"{label}_loss_minidist"] - r[f"{label}_loss_torch"])
        <= LOSS_RTOL * abs(r[f"{label}_loss_torch"])
        for r in results
    )


@bench("zero")
def bench_zero(world_size: int, rounds: int, steps: int) -> dict[str, float]:
    """minidist FSDP and ZeRO-1 vs torch's FSDP2 and DDP + ZeroRedundancyOptimizer."""
    results = launch(_zero_bench_rank, world_size, rounds, steps, timeout_s=1800)
    r = results[0]
    out: dict = {}
    for label in ("fsdp", "zero1"):
        keys = ["step_ratio_vs_torch", "step_ms_minidist", "step_ms_torch"]
        keys += ["torch_baseline", "torch_error"]
        out |= {f"{label}_{k}": r[f"{label}_{k}"] for k in keys if f"{label}_{k}" in r}
        same = _same_loss(results, label)
        if same is not None:
            out[f"{label}_same_loss"] = same
            diff = max(abs(x[f"{label}_loss_minidist"] - x[f"{label}_loss_torch"]) for x in results)
            out[f"{label}_loss_max_abs_diff"] = diff
            out[f"{label}_loss"] = r[f"{label}_loss_torch"]
    out["params"] = r["params"]
    out["world_size"] = world_size
    return out
