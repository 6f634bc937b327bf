"""`parallelize(model, dims)`: every parallelism at once, as steps from the lessons.

Any model (the course GPT, its MoE form and Llama, or a transformers causal LM:
`check_course_layout` / `check_layout` refuse what is not composed, in the parent) goes
through functions that edit a copy of it in place, and its own forward runs, once: no
forward of a model is written a second time here. Its loss is its own (a transformers
model's: the mean over labels ≠ -100 of the global batch; the course's: `lm_loss`).
`theory.py` plans the course models' states and bytes to the byte.

The whole model is built on every rank (the same seed, so the same weights), then each
rank keeps and transforms its part, in this order (torchtitan's `parallelize_llama` order;
each later step works on what the earlier ones left):

1. pipeline split (lesson 09, `split`): the rank's chunks (a copy of the model with the
   layers it does not hold removed: 1, `virtual` interleaved, or 2 in ZB-V's and DualPipeV's
   V), driven by lesson 09's engine with any of its schedules; any layers ≥ stages, dealt
   out as evenly as possible (lesson 10's `stage_layers`);
2. tensor and sequence parallelism from a plan of module names (lessons 07 and 14,
   `tensor_parallel`): the attention's and the MLP's input enters once, the rank's heads;
3. context parallelism (lesson 15, `context_parallel`): the tokens' global positions, and
   ring attention over cp on the zig-zag split as the attention's kernel, the only call
   swapped;
4. experts over ep (`experts`: lesson 16's `ExpertParallelMoE` for the course MoE, exact or
   padded exchange; a transformers model's stacked experts);
5. recomputation of every layer (lesson 08's `recompute`, non-reentrant);
6. ZeRO-1 over dp_shard × cp (lesson 10's `ZeroRedundancyOptimizer`: the reduce-scatter of
   the gradients, Adam on this rank's chunk of a float32 copy, the all-gather), or with
   `dp_shard_mode` ZeRO-2 or ZeRO-3 (FSDP) per layer (`fsdp.py`); with
   `optimizer_cpu_offload` (Megatron-core's name) the chunks and Adam's state in host memory
   and the step on the host (lesson 05, ZeRO-Offload: gradients down, the chunk up);
7. replication over dp_replicate (HSDP: the gradients all-reduced across the replicas
   before the reduce-scatter, Zhao et al. 2023 "PyTorch FSDP" section 3.2.2);
8. mixed precision (lesson 12's rule): bf16 parameters and compute, float32 master weights,
   optimizer states and gradient reduce-scatter.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .. import comm
from ..context_parallel.split import positions
from ..expert_parallel.gpt import is_expert
from ..model_parts import family, find_parts
from ..parallel import ParallelModule, all_reduce_flat
from ..pipeline.engine import PipelineParallel
from ..pipeline.schedules import schedule, virtual_stage
from ..pipeline.stages import Stage, StageContext
from ..recompute.checkpoint import recompute as recompute_module
from ..zero.optimizer import ZeroRedundancyOptimizer
from .context_parallel import apply_context_parallel
from .dims import Grid, ParallelDims
from .experts import apply_expert_parallel, sequence_parallel_moe
from .fsdp import ShardedDataParallel, check_mode
from .layout_check import check_course_layout, check_layout, model_sizes
from .optim import OptimizerConfig, shard_optimizer
from .split import split_model
from .state import StatePieces
from .tensor_parallel import apply_tensor_parallel, conv1d_to_linear, sum_partial_gradients


class ComposedParallel(StatePieces, PipelineParallel):
    """This rank's chunks of `model` under `dims`, trained by lesson 09's engine; the
    optimizer is built in (`step()` after `finish_gradient_sync()`).

    Which group reduces which gradient (each over exactly the ranks holding a copy; the loss
    of a rank is the mean over its tokens, every rank has as many, so the global batch's token
    mean is the mean over the dp_replicate · dp_shard · cp data ranks):

    | parameter                         | summed over                                  |
    |-----------------------------------|----------------------------------------------|
    | dense (attention, MLP, norms)     | dp_replicate × dp_shard × cp, / their number |
    | replicated under sp (norms, biases, pos_emb) | also tp (partial sums per sequence block) |
    | K/V replicated (tp ∤ kv_heads)    | also tp (each rank's query heads' share)     |
    | latent attention's q_a, kv_a, norms | also tp (each rank's heads' share)         |
    | tied embedding (GPT)              | also the first and last stage                |
    | an expert (ep > 1)                | expert_dp (the ranks holding it), / d·s·c    |
    | the router                        | dense: dp_replicate × dp_shard × cp          |

    Experts under tp (the course MoE): every tp rank holds its ep share of the experts whole and
    runs the layer on the same tokens (the block's input is whole on every tp rank), so the tp
    ranks compute the same expert gradients and an expert is reduced over expert_dp within its tp
    rank, never over tp (torchtitan's expert tensor parallel degree 1; the all-to-all runs within
    each tp rank's slice of the ep group). Under sp the MoE layer gathers the whole sequence
    first and hands back the rank's block (`experts.sequence_parallel_moe`), so the same holds.
    """

    measure_activations = False  # the CLI turns it on to print the activations' peak

    def __init__(
        self,
        model: nn.Module,
        dims: ParallelDims,
        grid: Grid | None = None,
        microbatches: int = 1,
        precision: str = "fp32",
        recompute: bool = False,
        lr: float = 1e-2,
        pad_to_capacity: bool = False,
        seq_len: int | None = None,
        optimizer: str = "adam",
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        dp_shard_mode: str = "optim",
        reshard_after_forward: bool = True,
        valid_token_mean: bool | None = None,
        optimizer_cpu_offload: bool = False,
    ):
        ParallelModule.__init__(self)
        self.offload = bool(optimizer_cpu_offload)
        self.dp_shard_mode = check_mode(dp_shard_mode)
        self.reshard_after_forward = reshard_after_forward
        if precision not in ("fp32", "bf16"):
            raise ValueError(f"parallelize: precision={precision!r} must be 'fp32' or 'bf16'")
        optim = OptimizerConfig(optimizer, lr, weight_decay, tuple(betas), eps).check(1)
        self.hf = family(model) == "hf"  # else the course GPT, its MoE or Llama (or refused)
        sizes = model_sizes(model)
        if self.hf:
            if seq_len is None:
                raise ValueError(
                    "parallelize: seq_len= (the batches' sequence length) is "
                    "needed for a transformers model"
                )
            sizes.update(check_layout(model, dims, seq_len))
        else:
            check_course_layout(model, dims)
        grid = grid or Grid(dims)
        self.dims, self.grid, self.sizes, self.precision = dims, grid, sizes, precision
        self.kind, self.m, self.p, self.v = dims.schedule, microbatches, dims.pp, dims.chunks
        self.stage_index, self.ranks = grid.coord["pp"], grid.mine["pp"]
        seq = sizes["seq_len"]
        where = torch.device(next(model.parameters()).device)
        self.ctx = StageContext(positions(seq, dims.cp, grid.coord["cp"], "zigzag", where), seq)
        # the loss: the mean over the global batch's targets ≠ -100 (their count all-reduced
        # each step: 8 bytes over dp_cp), a transformers model's always; the course models'
        # only when asked (targets that may be -100), else each micro-batch's plain mean
        self.count_tokens = self.hf if valid_token_mean is None else bool(valid_token_mean)
        if not self.count_tokens:
            self.ctx.tokens = None
        tp = grid.group("tp") if dims.tp > 1 else None
        cp = grid.group("cp") if dims.cp > 1 else None
        # GPT-2's Conv1D weights are held as nn.Linear's (transposed): named for the edges
        self.transposed = {
            f"{n}.weight" for n, m in model.named_modules() if type(m).__name__ == "Conv1D"
        }
        self.tied_copy, self.chunks = {}, []
        stages = self.p * self.v
        for c in range(self.v):
            vs = virtual_stage(self.kind, self.stage_index, c, self.p)
            stage = split_model(model, stages, vs, self.ctx)  # 1. the pipeline split
            conv1d_to_linear(stage.model)
            if tp is not None:  # 2. tensor and sequence parallelism
                if dims.sp:  # the course MoE sees whole sequences (`experts`)
                    sequence_parallel_moe(stage.model, tp)
                apply_tensor_parallel(stage, tp, dims.sp, sizes)
            if cp is not None:  # 3. ring attention over cp, as the attention's kernel
                apply_context_parallel(stage, cp, seq)
            if dims.ep > 1:  # 4. experts over ep (the course MoE: within each tp rank)
                groups = (grid.group("expert_dp"), grid.group("dp_cp"), pad_to_capacity)
                apply_expert_parallel(stage.model, sizes["experts"], grid.group("ep"), *groups)
            if recompute:  # 5. (non-reentrant: HF's layers take keyword arguments)
                for layer in stage.layers():
                    recompute_module(layer, use_reentrant=False)
            if stage.tied and stage.last and not stage.first:
                emb = getattr(find_parts(model).base, stage.parts.token)
                self.tied_copy[f"{stage.parts.head}.weight"] = next(
                    n for n, p in model.named_parameters() if p is emb.weight
                )
            self.chunks.append(stage)
        self.module = self.chunks[0] if self.v == 1 else nn.ModuleList(self.chunks)
        self.steps = schedule(self.kind, self.p, microbatches, dims.virtual)[self.stage_index]
        last = [ch for ch in self.chunks if ch.last]
        self.loss_fn = last[0].loss if last else None
        self.hidden = sizes["hidden"]
        self.pp_group, self.dp_group = grid.group("pp"), None  # dp: `finish_gradient_sync`
        self.embedding_group = grid.groups.get("embedding")  # first and last stage only
        self.peak_alive = self.peak_saved_bytes = self.saved_per_microbatch = 0
        self.timings = None
        self._optimizers(optim)  # 6. ZeRO-1 over dp_shard × cp (7. HSDP in finish_gradient_sync)
        if precision == "bf16":  # 8. after the float32 master copies were taken
            for chunk in self.chunks:
                chunk.to(torch.bfloat16)
            self.ctx.dtype = torch.bfloat16
        if self.data_parallel is not None:  # 6. the units' hooks, on the compute dtype
            self.data_parallel.install()

    def train_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
        """Lesson 09's step; for a transformers model the loss is the model's: the mean over
        the global batch's valid targets (≠ -100), counted with one all-reduce. A third
        tensor in `batch` is the attention mask ([b, s], 0 at padding), passed to the model."""
        return super().train_step(self._count_targets(batch))

    def eval_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
        """Lesson 09's forward-only evaluation, the loss as `train_step`'s."""
        return super().eval_step(self._count_targets(batch))

    def _count_targets(self, batch: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, targets); under the valid-token mean, the step's valid targets counted over
        the data ranks and an attention mask (a third tensor) handed to its stages."""
        if not self.count_tokens:
            return batch
        if len(batch) == 3:  # (ids, targets, attention mask): padding the model masks
            if self.dims.cp > 1:
                raise ValueError(
                    "parallelize: an attention mask with cp > 1 is not composed (ring "
                    "attention is causal only)"
                )
            self.ctx.masks = list(batch[2].to(self.device).chunk(self.m))
            batch = batch[:2]
            for chunk in self.chunks:
                chunk.seen = 0
        else:
            self.ctx.masks = None
        d = self.dims.dp_replicate * self.dims.dp_shard * self.dims.cp
        count = (batch[1] != -100).sum().to(torch.float64).reshape(1)
        if d > 1:
            count = count.to(comm.group_device(self.grid.group("dp_cp")))
            comm.all_reduce(count, group=self.grid.group("dp_cp"), tag="loss-tokens")
        self.ctx.tokens, self.ctx.scale = max(float(count), 1.0), float(self.m * d)
        return batch

    def _named(self) -> dict[str, torch.Tensor]:
        """{one-process name: parameter} of every chunk (experts renumbered; the GPT's last
        chunk's copy of the tied embedding under its own name, `lm_head.weight`)."""
        out = {}
        for chunk in self.chunks:
            for n, p in chunk.named_parameters():
                out[self._reference_name(chunk, n)] = p
        return out

    def _reference_name(self, chunk: Stage, name: str) -> str:
        """The one-process name of `chunk`'s parameter `name` (the course MoE's experts
        renumbered from the rank's first)."""
        if ".experts." in name and self.dims.ep > 1 and not self.hf:
            head, rest = name.split(".experts.", 1)
            i, tail = rest.split(".", 1)
            name = f"{head}.experts.{chunk.get_submodule(head).first + int(i)}.{tail}"
        return name.removeprefix("model.")

    def _optimizers(self, optim: OptimizerConfig) -> None:
        """ZeRO-1 over each group, or per layer unit (`fsdp.py`: ZeRO-2, ZeRO-3); the inner
        Adam/AdamW decays only ndim ≥ 2 (`optim.py`)."""
        named = self._named()
        expert = {n for n in named if self.dims.ep > 1 and is_expert(n)}
        self.dense_names = [n for n in named if n not in expert and named[n].requires_grad]
        self.expert_names = [n for n in named if n in expert and named[n].requires_grad]
        self.optimizers, self.data_parallel = [], None
        if self.dp_shard_mode != "optim":
            self.data_parallel = ShardedDataParallel(
                self, self.dp_shard_mode, self.reshard_after_forward
            )
            self.optimizers = self.data_parallel.units
        for names, kind in ((self.dense_names, "dp_shard_cp"), (self.expert_names, "ep_shard")):
            if names and self.data_parallel is None:
                opt = ZeroRedundancyOptimizer(
                    [named[n] for n in names],
                    torch.optim.Adam,
                    group=self.grid.group(kind),
                    lr=optim.lr,
                )
                self.optimizers.append((names, opt))
        for _, opt in self.optimizers:
            if self.offload:  # lesson 05: the chunk and Adam's state in host memory
                opt.offload()
            opt.inner = shard_optimizer(opt, optim)
            state = opt.inner.state[opt.shard]  # made now, so pieces exist before step 1
            state["step"] = torch.tensor(0.0, device="cpu")  # where torch keeps it
            state["exp_avg"] = torch.zeros_like(opt.shard)
            state["exp_avg_sq"] = torch.zeros_like(opt.shard)

    def activation_shape(self, x: torch.Tensor) -> tuple[int, ...]:
        s = x.shape[1] // (self.dims.tp if self.dims.sp else 1)
        return (x.shape[0] // self.m, s, self.hidden)

    def zero_grad(self) -> None:
        for p in self.module.parameters():
            p.grad = None
        if self.data_parallel is not None:
            self.data_parallel.zero_grad()

    @torch.no_grad()
    def finish_gradient_sync(self) -> None:
        """HSDP's all-reduce over dp_replicate, then ZeRO's reduce-scatter (the mean over
        dp_shard × cp; experts scaled by 1/ep first: their gradient already sums their
        ep group's ranks' losses). ZeRO-2/3: the units' (`fsdp.py`)."""
        if self.data_parallel is not None:
            self.data_parallel.finish()
            return
        if self.dims.tp > 1:  # over tp, once per step
            sum_partial_gradients(list(self.module.parameters()), self.grid.group("tp"))
        named = self._named()
        for n in self.expert_names:
            if named[n].grad is not None:
                named[n].grad.div_(self.dims.ep)
        if self.dims.dp_replicate > 1:
            grads = [p.grad for p in named.values() if p.grad is not None]
            all_reduce_flat(grads, self.grid.group("dp_replicate"), "hsdp-grads")
            for g in grads:
                g.div_(self.dims.dp_replicate)
        for _, opt in self.optimizers:
            opt.reduce_gradients()

    def step(self) -> None:
        for _, opt in self.optimizers:
            opt.update()

    def moved(self) -> dict[str, int]:
        """Bytes copied between the device and the host so far (offloaded chunks)."""
        out = {"device_to_host": 0, "host_to_device": 0}
        for _, opt in self.optimizers:
            for way, n in opt.moved.items():
                out[way] += n
        return out

    def _edges(self, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Whole tensors in the model's own layout (GPT-2's Conv1D weights transposed back)."""
        out = {}
        for key, t in full.items():
            name = key.removeprefix("optim.")
            for state in (".exp_avg_sq", ".exp_avg", ".step"):
                name = name.removesuffix(state) if key.startswith("optim.") else name
            out[key] = t.t().contiguous() if name in self.transposed and t.dim() == 2 else t
        return out

    def full_parameters(self) -> dict[str, torch.Tensor]:
        return self._edges(super().full_parameters())

    def full_grads(self) -> dict[str, torch.Tensor]:
        return self._edges(super().full_grads())

    def full_optimizer_state(self) -> dict[str, torch.Tensor]:
        return self._edges(super().full_optimizer_state())


def parallelize(model: nn.Module, dims: ParallelDims, **options) -> ComposedParallel:
    """`model` (the course GPT, its MoE form, or a Hugging Face-layout Llama), built whole
    and alike on every rank, as this rank's part of the layout `dims`."""
    return ComposedParallel(model, dims, **options)
