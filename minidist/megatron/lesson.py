"""Lessons 07 and 08's entries in the harnesses: two tour rows and the `tp` bench.

- "tensor parallel" (lesson 07): `TensorParallelGPT` on tp = the tour's world (2 where the
  model's heads do not divide by it), against the dense GPT in one process; memory per rank
  against `theory.model_state_bytes_per_rank`, bytes per step against
  `theory.bytes_sent_per_step` (the comparison contract's gathers left out).
- "parallel layout" (lesson 08): tp = 2 inside, dp = N/2 across, lesson 01's
  `BucketedDataParallel` on the dp groups around the tensor-parallel GPT; bytes against
  `theory.layout_bytes_sent_per_step`.
- `tp` bench: minidist's column/row-parallel MLP blocks against torch's DTensor tensor
  parallelism (`parallelize_module` with `ColwiseParallel` / `RowwiseParallel` on
  `init_device_mesh` of the ranks' device type), same model, data and optimizer, interleaved.
"""

from __future__ import annotations

import copy
import statistics
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..bench import interleaved_ab
from ..registry import TourRow, bench, tour_row
from ..runtime import launch, rank_device
from . import theory
from .fixture import (
    STEPS,
    build_dense,
    compare,
    dp_mean_losses,
    layout_train_on_rank,
    matches,
    memory_theory,
    reference,
    train_on_rank,
)


def tour_tp(world_size: int) -> int:
    """The tour's tensor-parallel size: N if the model's heads and hidden size divide by
    it, else 2."""
    cfg = build_dense().model.cfg
    ok = world_size >= 1 and cfg.heads % world_size == 0 and cfg.hidden % world_size == 0
    return world_size if ok else 2


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


@tour_row("tensor parallel", lesson=7)
def tensor_parallel_row(world_size: int, out_dir: Path) -> TourRow:
    from .plots import plot_weight_split

    tp = tour_tp(world_size)
    model, batches, _ = build_dense()
    cfg = model.cfg
    ref = reference()
    runs = launch(train_on_rank, tp)
    diffs = [compare(run.trace, ref) for run in runs]
    sent = sum(r.ring_bytes for r in runs[0].records) / STEPS
    b, s = batches[0][0].shape
    _save(plot_weight_split(tp, cfg.hidden, cfg.heads, cfg.vocab_size), out_dir / "tp_split.png")
    return TourRow(
        f"tensor parallel (t={tp})",
        all(matches(d) for d in diffs),
        max(d["param"] for d in diffs),
        memory_per_rank=runs[0].memory.total,
        memory_theory=memory_theory(tp),
        bytes_per_rank=sent,
        bytes_theory=theory.bytes_sent_per_step(cfg.layers, b, s, cfg.hidden, tp),
    )


def layout_shape(world_size: int) -> tuple[int, int]:
    """(tp, dp) of the layout row: TP of 2 inside, DP across the N/2 pairs (an odd N leaves
    its last rank out)."""
    return 2, max(1, world_size // 2)


@tour_row("parallel layout", lesson=8)
def parallel_layout_row(world_size: int, out_dir: Path) -> TourRow:
    from .plots import plot_rank_grid

    tp, dp = layout_shape(world_size)
    model, batches, _ = build_dense()
    cfg = model.cfg
    ref = reference()
    runs = launch(layout_train_on_rank, tp * dp, tp)
    losses = dp_mean_losses(runs)
    diffs = [compare(run.trace, ref, losses) for run in runs]
    sent = sum(r.ring_bytes for r in runs[0].records) / STEPS
    b, s = batches[0][0].shape
    _save(plot_rank_grid(tp * dp, tp, 1, gpus_per_node=tp), out_dir / "layout_groups.png")
    return TourRow(
        f"layout (t={tp} x d={dp})",
        all(matches(d) for d in diffs),
        max(d["param"] for d in diffs),
        memory_per_rank=runs[0].memory.total,
        memory_theory=memory_theory(tp),
        bytes_per_rank=sent,
        bytes_theory=theory.layout_bytes_sent_per_step(
            cfg.layers, b, s, cfg.hidden, tp, dp, runs[0].trainable
        ),
    )


# -- bench: minidist's tensor-parallel MLP blocks vs torch's DTensor tensor parallelism ------

# Pre-LayerNorm MLP blocks, x + W2·GELU(W1·LN(x)): a transformer's MLP half, the part both
# libraries split the same way (column-parallel W1, row-parallel W2). About 8.4M parameters.
BENCH = dict(hidden=512, layers=4, batch=4, seq=64)
SGD = dict(lr=1e-2, momentum=0.9)
# float32 on both sides, the same all-reduces in the same places; only the summation order of
# the partial products may differ: the eval losses agree to ~1e-6 relative after the steps.
LOSS_RTOL = 1e-4


class MLPBlock(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(
            nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.ln(x))


class MLPStack(nn.Module):
    def __init__(self, hidden: int, layers: int):
        super().__init__()
        self.blocks = nn.ModuleList(MLPBlock(hidden) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def _minidist_tp(model: MLPStack) -> MLPStack:
    from .layers import parallel_mlp

    for block in model.blocks:
        block.mlp = parallel_mlp(block.mlp, None)
    return model


def _torch_tp(model: MLPStack) -> MLPStack:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh(rank_device().type, (dist.get_world_size(),))
    plan = {}
    for i in range(len(model.blocks)):
        plan[f"blocks.{i}.mlp.0"] = ColwiseParallel()
        plan[f"blocks.{i}.mlp.2"] = RowwiseParallel()
    return parallelize_module(model, mesh, plan)


def _stepper(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    opt = torch.optim.SGD(model.parameters(), **SGD)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.mse_loss(model(x), y).backward()
        opt.step()

    return step


@torch.no_grad()
def _eval_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    out = model(x)
    out = out.full_tensor() if hasattr(out, "full_tensor") else out
    return float(F.mse_loss(out, y))


def ab_against_torch(ours, make_native, data, rounds: int, steps: int) -> dict:
    """On a rank: SGD steps of `ours` and of `make_native()` (torch's version of the same
    blocks) on `data` = (x, y, x_eval, y_eval), interleaved; their step times and eval
    losses, or `torch_error` and our time alone when torch's side fails on this machine.
    Lesson 14's `sp` bench uses it too."""
    x, y, x_eval, y_eval = data
    step_ours = _stepper(ours, x, y)
    out: dict = {"params": sum(p.numel() for p in ours.parameters())}
    try:
        native = make_native()
        step_native = _stepper(native, x, y)
        step_native()  # fails here, before any timing, if the backend lacks something
    except Exception as e:  # any failure here means: no torch baseline on this machine
        out["torch_error"] = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
        ab = interleaved_ab(step_ours, lambda: None, rounds, steps)
        out["ms_ours"] = 1e3 * statistics.median(ab.seconds_a)
        return out
    step_ours()  # the native side took one extra step above: keep the two in step
    ab = interleaved_ab(step_ours, step_native, rounds, steps)
    return out | {
        "ratio": ab.ratio,
        "ms_ours": 1e3 * statistics.median(ab.seconds_a),
        "ms_torch": 1e3 * statistics.median(ab.seconds_b),
        "loss_ours": _eval_loss(ours, x_eval, y_eval),
        "loss_torch": _eval_loss(native, x_eval, y_eval),
    }


def ab_report(prefix: str, results: list[dict], world_size: int, params: int) -> dict:
    """The bench's name=value lines from every rank's `ab_against_torch`."""
    r = results[0]
    if "torch_error" in r:
        return {
            f"{prefix}_torch_baseline": "unavailable",
            f"{prefix}_torch_error": r["torch_error"],
            f"{prefix}_step_ms_minidist": r["ms_ours"],
            f"{prefix}_params": params,
            "world_size": world_size,
        }
    diff = max(abs(x["loss_ours"] - x["loss_torch"]) for x in results)
    return {
        f"{prefix}_step_ratio_vs_torch": r["ratio"],
        f"{prefix}_step_ms_minidist": r["ms_ours"],
        f"{prefix}_step_ms_torch": r["ms_torch"],
        f"{prefix}_same_loss": diff <= LOSS_RTOL * abs(r["loss_torch"]),
        f"{prefix}_loss_max_abs_diff": diff,
        f"{prefix}_loss": r["loss_torch"],
        f"{prefix}_params": params,
        "world_size": world_size,
    }


def _tp_bench_rank(rounds: int, steps: int) -> dict:
    h, layers, b, s = (BENCH[k] for k in ("hidden", "layers", "batch", "seq"))
    torch.manual_seed(0)
    dense = MLPStack(h, layers).to(rank_device())  # a GPU rank's under NCCL, else the CPU
    g = torch.Generator().manual_seed(1)  # the same data on every rank: TP replicates it
    data = tuple(
        torch.randn(b, s, h, device="cpu", generator=g).to(rank_device()) for _ in range(4)
    )
    ours = _minidist_tp(copy.deepcopy(dense))
    out = ab_against_torch(ours, lambda: _torch_tp(copy.deepcopy(dense)), data, rounds, steps)
    return out | {"params": sum(p.numel() for p in dense.parameters())}


@bench("tp")
def bench_tp(world_size: int, rounds: int, steps: int) -> dict[str, float]:
    """minidist's tensor-parallel MLP blocks vs torch's DTensor TP: same model, data, world."""
    results = launch(_tp_bench_rank, world_size, rounds, steps, timeout_s=1800)
    return ab_report("tp", results, world_size, results[0]["params"])
