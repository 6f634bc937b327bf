"""Lesson 14's entries in the harnesses: the "sequence parallel" tour row and the `sp` bench.

- "sequence parallel": `TensorParallelGPT(..., sequence_parallel=True)` on tp = the tour's
  world (2 where the model does not divide by it), against the dense GPT in one process;
  bytes per step against `theory.bytes_sent_per_step`; the memory column is what changes:
  one layer's saved activations per rank against `theory.activation_bytes_per_layer`.
- `sp` bench: pre-LayerNorm MLP blocks with sequence parallelism, minidist's (lesson 07's
  column/row-parallel layers with `sequence_parallel` set) against torch's DTensor
  (`SequenceParallel` on the norms, `ColwiseParallel(input_layouts=Shard(1))`,
  `RowwiseParallel(output_layouts=Shard(1))`: torchtitan's plan), same model, data, world.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import torch.distributed as dist

from ..megatron.fixture import STEPS, build_dense, compare, matches, reference
from ..megatron.lesson import BENCH, MLPStack, ab_against_torch, ab_report, tour_tp
from ..megatron.sequence import allreduce_replicated_grad, split_sequence
from ..registry import TourRow, bench, tour_row
from ..runtime import launch, rank_device
from . import theory
from .fixture import layer_terms_on_rank, train_on_rank

ACT_BATCH = 8  # sequences in the activation measurement


@tour_row("sequence parallel", lesson=14)
def sequence_parallel_row(world_size: int, out_dir: Path) -> TourRow:
    from .plots import plot_activation_terms

    tp = tour_tp(world_size)
    model, batches, _ = build_dense()
    cfg = model.cfg
    runs = launch(train_on_rank, tp, True)
    diffs = [compare(run.trace, reference()) for run in runs]
    sent = sum(r.ring_bytes for r in runs[0].records) / STEPS
    b, s = batches[0][0].shape
    measured = launch(layer_terms_on_rank, tp, ACT_BATCH, True)[0]["total"]
    fig = plot_activation_terms(cfg.seq_len, ACT_BATCH, cfg.hidden, cfg.heads, (1, 2, 4))
    fig.savefig(out_dir / "sp_activations.png", dpi=100, bbox_inches="tight")
    return TourRow(
        f"sequence parallel (t={tp}; memory: activations/layer)",
        all(matches(d) for d in diffs),
        max(d["param"] for d in diffs),
        memory_per_rank=measured,
        memory_theory=int(
            theory.activation_bytes_per_layer(cfg.seq_len, ACT_BATCH, cfg.hidden, cfg.heads, tp)
        ),
        bytes_per_rank=sent,
        bytes_theory=theory.bytes_sent_per_step(
            cfg.layers, b, s, cfg.hidden, tp, runs[0].replicated_trainable
        ),
    )


# -- bench: minidist's sequence-parallel MLP blocks vs torch's DTensor SequenceParallel -----


def _minidist_sp(model: MLPStack) -> MLPStack:
    from ..megatron.layers import parallel_mlp

    for block in model.blocks:
        block.mlp = parallel_mlp(block.mlp, None)
        block.mlp[0].sequence_parallel = block.mlp[2].sequence_parallel = True
    for p in model.parameters():
        if not hasattr(p, "tp_split"):  # layer norms, the second Linear's bias
            p.register_hook(lambda g: allreduce_replicated_grad(g, None))
    return model


def _torch_sp(model: MLPStack) -> MLPStack:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    mesh = init_device_mesh(rank_device().type, (dist.get_world_size(),))
    plan = {}
    for i in range(len(model.blocks)):
        plan[f"blocks.{i}.ln"] = SequenceParallel()
        plan[f"blocks.{i}.mlp.0"] = ColwiseParallel(input_layouts=Shard(1))
        plan[f"blocks.{i}.mlp.2"] = RowwiseParallel(output_layouts=Shard(1))
    return parallelize_module(model, mesh, plan)


def _sp_bench_rank(rounds: int, steps: int) -> dict:
    h, layers, b, s = (BENCH[k] for k in ("hidden", "layers", "batch", "seq"))
    torch.manual_seed(0)
    dense = MLPStack(h, layers).to(rank_device())  # a GPU rank's under NCCL, else the CPU
    g = torch.Generator().manual_seed(1)  # every rank its block of the same sequences
    data = tuple(
        split_sequence(torch.randn(b, s, h, device="cpu", generator=g).to(rank_device()), None)
        for _ in range(4)
    )
    ours = _minidist_sp(copy.deepcopy(dense))
    out = ab_against_torch(ours, lambda: _torch_sp(copy.deepcopy(dense)), data, rounds, steps)
    return out | {"params": sum(p.numel() for p in dense.parameters())}


@bench("sp")
def bench_sp(world_size: int, rounds: int, steps: int) -> dict[str, float]:
    """minidist's sequence-parallel MLP blocks vs torch's DTensor `SequenceParallel`."""
    results = launch(_sp_bench_rank, world_size, rounds, steps, timeout_s=1800)
    return ab_report("sp", results, world_size, results[0]["params"])
