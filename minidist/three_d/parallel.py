"""3D parallelism: tensor parallel inside a stage, pipeline across stages, data parallel
across pipelines, with ZeRO-1 over the data-parallel group.

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (SC), sections 2-3: ranks form a grid t × p × d (`ParallelLayout`); each
pipeline stage is a tensor-parallel group; the pipeline schedule (lesson 09's engine)
passes activations between matching tp ranks of consecutive stages; the data-parallel
replicas reduce their gradients once per step, here with `ZeroRedundancyOptimizer`, which
also shards the optimizer state over them (ZeRO-1, as Megatron-LM's distributed optimizer).
"""

from __future__ import annotations

import torch

from ..megatron.layers import gather_split
from ..parallel import ParallelModule
from ..pipeline.engine import PipelineParallel
from ..pipeline.schedules import schedule
from .stage import split_tensor_parallel_gpt


class ThreeDParallel(PipelineParallel):
    """This rank's tensor-parallel stage of one pipeline; gradients left to the optimizer
    for the data-parallel reduction (build a `ZeroRedundancyOptimizer` over
    `layout.group("dp")` on `module.parameters()`)."""

    def __init__(self, dense, layout, kind: str = "1f1b", microbatches: int = 4):
        ParallelModule.__init__(self)
        if kind not in ("gpipe", "1f1b", "zb-h1"):
            raise ValueError(f"ThreeDParallel: kind={kind!r} must be gpipe, 1f1b or zb-h1")
        pp_group = layout.group("pp")
        self.layout = layout
        self.p, self.stage_index = layout.pp_size, layout.pp_rank
        self.ranks = layout.mine["pp"]
        self.module = split_tensor_parallel_gpt(dense, layout)
        self.chunks, self.v = [self.module], 1
        self.steps = schedule(kind, self.p, microbatches)[self.stage_index]
        self.kind, self.m, self.hidden = kind, microbatches, dense.cfg.hidden
        self.loss_fn = self.module.loss if self.module.last else None
        self.pp_group, self.dp_group = pp_group, None  # DP: the ZeRO-1 optimizer's job
        self.embedding_group = layout.groups.get("embedding")
        self.peak_alive = self.peak_saved_bytes = self.saved_per_microbatch = 0
        self.timings = None

    def _tp_full(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The stage's dense tensors: split ones gathered over the tp group."""
        params, tp = self._named(), self.layout.group("tp")
        return {
            n: gather_split(t, params[n].tp_split, tp) if hasattr(params[n], "tp_split") else t
            for n, t in tensors.items()
        }

    def full_parameters(self) -> dict[str, torch.Tensor]:
        local = {n: p.detach().clone() for n, p in self._named().items()}
        return self._gathered(self._tp_full(local))

    def full_grads(self) -> dict[str, torch.Tensor]:
        local = {n: p.grad.clone() for n, p in self._named().items() if p.grad is not None}
        return self._gathered(self._tp_full(local))
