"""Lesson 17's models, data and runs: the same on every rank and in the one-process reference.

`build(name)`: the course GPT ("gpt"), its MoE form ("moe": 4 experts, top-1, capacity
factor 4 so no token is ever dropped) or the Llama-style model ("llama": RMSNorm, rotary,
SwiGLU, 4 query and 2 KV heads, untied head), 4 layers, hidden 32, sequences of 16
characters of the course corpus, the vocabulary padded to a multiple of 8 (so tp ≤ 8 splits
it evenly; the padding ids never occur). `run_rank` trains one layout on a world and
returns what the tests, the CLI and the notebook compare; `reference` the same in one
process, Adam at the same learning rate.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn as nn

from .. import comm
from ..data import CharTokenizer, lm_batches, make_corpus
from ..expert_parallel.gpt import moe_gpt
from ..models import GPT, GPTConfig, lm_loss
from ..models_llama import LlamaConfig, LlamaForCausalLM
from ..runtime.device import rank_device
from .dims import Grid, ParallelDims
from .optim import OptimizerConfig, clip_grad_norm_, engine_options, set_lr, torch_optimizer
from .parallelize import parallelize

MODELS = ("gpt", "moe", "llama")
SIZES = dict(seq_len=16, layers=4, heads=4, hidden=32)
LR = 1e-2


def build(name: str, steps: int = 3, global_batch: int = 8, seed: int = 0, **sizes):
    """(model on this rank's device, global batches); `name` may also be a function of the
    vocabulary size returning a model (a user's, in Hugging Face's Llama layout)."""
    if not callable(name) and name not in MODELS:
        raise ValueError(f"build: model={name!r} must be one of {MODELS}")
    torch.manual_seed(seed)
    text = make_corpus(200, seed=seed)
    tok = CharTokenizer(text)
    vocab = -(-tok.vocab_size // 8) * 8
    sizes = {**SIZES, **sizes}
    if callable(name):
        model = name(vocab)
    elif name == "llama":
        model: nn.Module = LlamaForCausalLM(
            LlamaConfig(vocab_size=vocab, kv_heads=2, ffn=2 * sizes["hidden"], **sizes)
        )
    elif name == "moe":
        model = moe_gpt(
            GPTConfig(vocab_size=vocab, **sizes), experts=4, k=1, capacity_factor=4.0, seed=seed
        )
    else:
        model = GPT(GPTConfig(vocab_size=vocab, **sizes))
    batches = lm_batches(tok.encode(text), steps, global_batch, sizes["seq_len"], seed=seed)
    return model.to(rank_device()), batches


def reference(
    name: str,
    steps: int = 3,
    global_batch: int = 8,
    seed: int = 0,
    optim: OptimizerConfig | None = None,
    **engine_kw,
) -> dict:
    """The one-process run of `build(name)`'s model and batches (`train_one_process`); by
    default Adam at `LR`."""
    model, batches = build(name, steps, global_batch, seed)
    return train_one_process(model, batches, optim or OptimizerConfig(lr=LR))


def train_one_process(
    model: nn.Module,
    batches,
    optim: OptimizerConfig,
    after_step: Callable[[], object] | None = None,
) -> dict:
    """`model` trained on `batches` (global (x, y) pairs) in one process with torch's
    optimizer (`compose.optim.torch_optimizer`: Adam or AdamW, `LambdaLR`, `clip_grad_norm_`)
    -> losses, final parameters, Adam's state under the pieces' names, and with
    `optim.clip_grad` each step's gradient norm before clipping (`norms`). A model may return
    logits or an output with `.logits` (Hugging Face's).

    A parameter no token reached (an expert nobody chose) gets a zero gradient rather than
    none, as in ZeRO's flat buffer (torch's Adam would skip it: no step, no decay of its
    moments). `after_step()` runs after each optimizer step (lesson 19's routing bias)."""
    batches = list(batches)
    opt, schedule = torch_optimizer(model, optim, len(batches))
    losses, norms = [], []
    for x, y in batches:
        opt.zero_grad()
        out = model(x.to(rank_device()))
        loss = lm_loss(getattr(out, "logits", out), y.to(rank_device()))
        loss.backward()
        for p in model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if optim.clip_grad is not None:
            norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), optim.clip_grad)))
        opt.step()
        schedule.step()
        if after_step is not None:
            after_step()
        losses.append(loss.item())
    names = {p: n for n, p in model.named_parameters()}
    optim_state = {}
    for p, state in opt.state.items():
        for key, value in state.items():
            optim_state[f"optim.{names[p]}.{key}"] = value.detach().cpu().clone()
    params = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
    return {"losses": losses, "params": params, "optim": optim_state, "norms": norms}


def memory_by_kind(engine) -> dict[str, int]:
    """Bytes this rank holds per kind: parameters, gradients, float32 master weights,
    optimizer states, saved activations (peak, when measured); offloaded, the chunks' float32
    copies, their reduced gradients and Adam's state as `host_*` (none on the device)."""
    params = list(engine.module.parameters())
    shards = [opt.shard for _, opt in engine.optimizers]
    sharded = getattr(engine, "data_parallel", None)
    grads = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    if sharded is not None:  # FSDP's freed parameters hold no storage
        params = [p for p in params if p.untyped_storage().size()]
    if sharded is not None:  # ZeRO-2/3: what the step's end found (the root's, the chunks)
        grads = sharded.grad_bytes + (0 if engine.offload else sharded.chunk_grad_bytes)
    out = {
        "params": sum(p.numel() * p.element_size() for p in params),
        "grads": grads,
        "master": sum(s.numel() * 4 for s in shards),
        "optimizer": sum(2 * s.numel() * 4 for s in shards),
        "activations": engine.peak_saved_bytes,
    }
    if engine.offload:  # lesson 05: the chunks, their gradients and Adam in host memory
        chunk_grads = sum(
            s.grad.numel() * s.grad.element_size() for s in shards if s.grad is not None
        )
        host_grads = sharded.chunk_grad_bytes if sharded is not None else chunk_grads
        out.update(host_master=out["master"], host_optimizer=out["optimizer"])
        out.update(host_grads=host_grads, master=0, optimizer=0)
    return out


BYTE_KINDS = {
    "tp": "tp",
    "cp": "cp",
    "pp": "pp",
    "embedding": "pp",
    "ep": "ep",
    "dp_shard_cp": "dp",
    "dp_replicate": "dp",
    "ep_shard": "dp",
    "dp_shard": "dp",
    "dp_cp": "dp",
    "expert_dp": "dp",
}


TAGS = {
    "zero1": "dp",
    "zero2": "dp",
    "fsdp": "dp",
    "clip": "dp",
    "hsdp": "dp",
    "pp": "pp",
    "cp": "cp",
    "tp": "tp",
    "sp": "tp",
    "ep": "ep",
    "loss-tokens": "dp",  # the valid targets' count, over the data ranks
}


def bytes_by_kind(ledger, grid: Grid) -> dict[str, float]:
    """Ring bytes this rank sent in one step, per group kind (dp, tp, pp, cp, ep): by the
    collective's tag (two kinds may be the same ranks: dp_shard_cp is cp when dp_shard = 1),
    else by its group. A step is `train_step`, `finish_gradient_sync` and `step`:
    - dp: ZeRO-1's float32 reduce-scatter of the gradients and all-gather of the updated
      chunks (over dp_shard × cp, and ep_shard for experts), HSDP's all-reduce of the
      gradients (in the parameters' dtype) over dp_replicate;
    - tp: f / g all-reduces, or under sp the all-gathers and reduce-scatters (with the
      backward re-gather), per micro-batch; the vocab-parallel cross entropy's three
      all-reduces; the replicated parameters' partial gradients' one all-reduce per step
      (per layer and micro-batch under ZeRO-2/FSDP: `sum_partial_gradients`);
    - pp: each activation and gradient sent (float32, `send`: its bytes; `recv`: 0), the
      loss's broadcast over the pipeline and the tied embedding's all-reduce;
    - cp: ring attention's K/V passes (forward and backward) and the dK/dV accumulators';
    - ep: the counts, dispatch and combine all-to-alls (forward and backward).
    - dp also: the clipping norm's one float64 all-reduce over the world (`--clip-grad`),
      and under the valid-token mean the count's float64 all-reduce over the data ranks.
    Left out: the loss's mean over the data ranks and the comparison contract's gathers."""
    out = dict.fromkeys(("dp", "tp", "pp", "cp", "ep"), 0.0)
    for r in ledger.records:
        by_tag = next((k for t, k in TAGS.items() if r.tag.startswith(t)), None)
        kind = by_tag or BYTE_KINDS.get(grid.kind_of(r.group_ranks) or "")
        if kind is None:
            raise ValueError(f"bytes_by_kind: {r.op} ({r.tag}) over {r.group_ranks}: no kind")
        out[kind] += r.ring_bytes
    return out


def data_rows(grid: Grid, global_batch: int) -> range:
    """The rows of a global batch this rank trains on: its data replica's (dp_replicate ·
    dp_shard of them, in order); cp and tp ranks of one replica share them."""
    dims = grid.dims
    d = dims.dp_replicate * dims.dp_shard
    data = grid.coord["dp_replicate"] * dims.dp_shard + grid.coord["dp_shard"]
    per = global_batch // d
    return range(data * per, (data + 1) * per)


def one_step(
    engine,
    grid: Grid,
    x: torch.Tensor,
    y: torch.Tensor,
    lr: float | None = None,
    clip_grad: float | None = None,
):
    """One step of `engine` on this rank's rows of the global batch (x, y: `data_rows`), its
    cp positions of them, at learning rate `lr` (None: the engine's), the gradient clipped
    to the global norm `clip_grad` (None: not) -> (the global batch's mean loss, seconds,
    the step's ledger, the gradient's norm before clipping or None)."""
    pos = engine.ctx.positions.cpu()
    x, y = (t[:, pos].to(rank_device()) for t in (x, y))
    engine.zero_grad()
    if lr is not None:
        set_lr(engine, lr)
    norm = None
    start = time.perf_counter()
    with comm.record() as ledger:
        loss = engine.train_step((x, y))
        engine.finish_gradient_sync()
        if clip_grad is not None:
            norm = clip_grad_norm_(engine, clip_grad)
        engine.step()
    seconds = time.perf_counter() - start
    mean = torch.tensor([loss], dtype=torch.float64, device=rank_device())
    comm.all_reduce(mean, group=grid.group("dp_cp"), tag="loss")
    return float(mean) / grid.size("dp_cp"), seconds, ledger, norm


def eval_step(engine, grid: Grid, x: torch.Tensor, y: torch.Tensor) -> float:
    """The global batch's mean loss on this rank's rows (x, y): the engine's forward only,
    in eval mode (`eval_step`: no backward, parameters, gradients and optimizer untouched)."""
    pos = engine.ctx.positions.cpu()
    x, y = (t[:, pos].to(rank_device()) for t in (x, y))
    loss = engine.eval_step((x, y))
    mean = torch.tensor([loss], dtype=torch.float64, device=rank_device())
    comm.all_reduce(mean, group=grid.group("dp_cp"), tag="loss")
    return float(mean) / grid.size("dp_cp")


def run_rank(
    name: str,
    dims: dict,
    steps: int = 3,
    global_batch: int = 8,
    micro_batch: int = 1,
    precision: str = "fp32",
    recompute: bool = False,
    seed: int = 0,
    measure: bool = False,
    progress=None,
    optim: OptimizerConfig | None = None,
    **engine_kw,
) -> dict:
    """On every rank of a world of `dims`' size: train, return the curve and the state
    (`optim`: as `reference`'s)."""
    optim = optim or OptimizerConfig(lr=LR)
    pdims = ParallelDims(**dims)
    model, batches = build(name, steps, global_batch, seed)
    grid = Grid(pdims)
    d = pdims.dp_replicate * pdims.dp_shard
    if global_batch % (d * micro_batch):
        raise ValueError(
            f"global_batch={global_batch} must divide by dp_replicate·dp_shard"
            f"·micro_batch = {d}·{micro_batch}"
        )
    m = global_batch // (d * micro_batch)
    engine = parallelize(
        model,
        pdims,
        grid=grid,
        microbatches=m,
        precision=precision,
        recompute=recompute,
        **engine_options(optim),
        **engine_kw,
    )
    engine.measure_activations = measure
    losses, times, ledgers, norms = [], [], [], []
    for i, (x, y) in enumerate(batches):
        rows = data_rows(grid, global_batch)
        x, y = x[rows.start : rows.stop], y[rows.start : rows.stop]
        before = engine.moved()
        loss, seconds, ledger, norm = one_step(
            engine, grid, x, y, optim.lr_at(i, steps), optim.clip_grad
        )
        moved = {way: n - before[way] for way, n in engine.moved().items()}
        norms.append(norm)
        losses.append(loss)
        times.append(seconds)
        ledgers.append(ledger)
        if progress is not None:
            progress(loss, seconds)
    return {
        "losses": losses,
        "norms": norms if optim.clip_grad is not None else [],
        "params": engine.full_parameters(),
        "optim": engine.full_optimizer_state(),
        "bytes": {**bytes_by_kind(ledgers[-1], grid), **(moved if engine.offload else {})},
        "memory": memory_by_kind(engine),
        "step_s": sorted(times)[len(times) // 2],
        "grid": grid.mine,
    }
