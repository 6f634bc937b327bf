"""The trainer's loop, one rank's view, top to bottom: build, parallelize, load, loop (step,
evaluate, save, log), export. `python -m minidist train` runs it on every rank (`cli.py`);
lesson 18's notebook and the tests call `train_rank` as it is.

- **build**: the data and the model from the options (`data.py`, `models.py`), the same on
  every rank; **parallelize**: lesson 17's engine with the run's optimizer (`compose.optim`);
- **load**: from `--resume` when it holds a complete checkpoint, or from its newest complete
  `step_<digits>` one (lesson 18's universal format, any layout); a checkpoint of another
  model or other data is refused, naming both;
- **loop** to step `--steps` (the total): one step of the global batch at the data position
  (this rank's rows only), the learning rate of the schedule, clipping; every
  `--eval-every` steps and at the end the held-out loss; a save every `--save-every` steps
  and at the end (`--async-save`: the write in the background, the step blocked only for
  the copy; `--keep-last N`: each into `step_<8 digits>` of `--save`, rank 0 then removing
  the older ones beyond N); rank 0 appends one JSON line per step to `--log`;
- **export**: `--export-hf DIR`, the whole trained weights and persistent buffers (a
  DeepSeek-V3 router's bias, gathered from its stage) as a Hugging Face folder.

What a checkpoint holds (`universal.save`, layout-free names): the engine's
`state_pieces()` (float32 master weights and Adam's states as rectangles of the one-process
tensors), the step, the data position as the *global* sample index (so a resume on any dp
degree trains on the next batch), every rank's random streams (restored on the same layout;
nothing in these models draws from them), and in its record's layout the model's whole
configuration and the data's identity. The engine has no loss scaler (bf16 needs none).

The log line: step, samples, loss, learning rate, gradient norm (when clipping), eval loss
and perplexity (when evaluated), the save's blocking seconds (when saved), seconds,
tokens/s, model FLOP/s (6·Ψ·tokens, Ψ the parameters a token meets, `active_parameters`;
Kaplan et al. 2020) and MFU against `--peak-flops` per rank when given, else this machine's
float32 matmul rate measured once on rank 0 (`matmul_flops`), the memory each rank holds by
kind and the ring bytes each rank sent by group kind (`compose.fixture`).

Callbacks, passed in: `progress(start_step, tokens_per_step)` returns the per-step display
`(loss, seconds, eval_loss)`; `after_step(step, grid)` runs after each step's save (the
tests' and lesson 18's dead rank: `cli.kill_rank_after`).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from .. import comm
from ..bench import matmul_flops, peak_flops
from ..checkpoint_files import CheckpointError, keep_last, newest, step_path
from ..checkpoint_pin import pin
from ..compose.dims import Grid, ParallelDims
from ..compose.fixture import (
    SIZES,
    bytes_by_kind,
    data_rows,
    eval_step,
    memory_by_kind,
    one_step,
    train_one_process,
)
from ..compose.optim import OptimizerConfig, engine_options
from ..compose.parallelize import parallelize
from ..deepseek.moe import count_expert_load, load_group, update_routing_bias
from ..model_parts import hf_sizes
from ..resilience.async_save import AsyncSaver
from ..resilience.state import TrainingState, capture_rng, restore_rng
from ..resilience.universal import CheckpointLayoutError, load, read_record, save
from ..runtime.device import rank_device
from .data import TokenData, course_data, load_data
from .models import build_model, export_hf, model_config
from .options import optimizer_config


def prepare(args) -> tuple[TokenData, dict, OptimizerConfig]:
    """The run's data, model configuration and optimizer, checked (ValueErrors name the
    option): the same in the parent, before any rank starts, and on every rank."""
    if args.data:
        data = load_data(args.data, args.seq_len, args.tokenizer)
    else:
        evals = args.eval_batches if args.eval_every else 0
        data = course_data(
            args.steps, args.global_batch, args.seq_len or SIZES["seq_len"], args.seed, evals
        )
    if args.eval_every:
        data.split(args.global_batch, args.eval_batches)
    if data.cycle and args.data:  # a token stream
        data.shuffle(args.seed)
    data.check(args.steps, args.global_batch)
    return data, model_config(args, data), optimizer_config(args)


def layout_of(args, dims: dict, model: dict, data: dict) -> dict:
    """The checkpoint record's `layout`: the dims, the precision, the model (its whole
    configuration, `models.model_config`) and the data's identity."""
    return {
        **dims,
        "model": model["model"],
        "precision": args.precision,
        "layers": model["layers"],
        "model_config": model,
        "data": data,
    }


def refuse_another_run(path: Path, layout: dict) -> None:
    """CheckpointLayoutError naming both when checkpoint `path` was saved by a run of another
    model or on other data (before anything is read into the engine)."""
    with pin(path) as pinned:
        saved = read_record(pinned)[2]["layout"]
    for key, what in (("model_config", "model"), ("data", "data")):
        if key in saved and key in layout and saved[key] != json.loads(json.dumps(layout[key])):
            raise CheckpointLayoutError(
                f"--resume {path}: saved with {what} {saved[key]}, "
                f"this run has {what} {layout[key]}"
            )


def active_parameters(model: torch.nn.Module) -> int:
    """Parameters a token meets: every one but the routed experts it is not sent to. A layer
    of E routed experts, k per token, counts k/E of them: the course MoE's `ModuleList` and
    transformers' stacked experts (Mixtral's, DeepSeek-V3's `experts.gate_up_proj`
    [E, 2f, h]); shared experts and routers are always met."""
    config = getattr(model, "config", None)
    idle = 0
    for name, experts in model.named_modules():
        if name.rpartition(".")[2] != "experts":
            continue
        moe = model.get_submodule(name.rpartition(".")[0])
        if isinstance(experts, torch.nn.ModuleList):
            routed = len(experts)
        else:  # transformers' stacked experts: tensors [E, ...]
            routed = getattr(experts, "num_experts", None) or hf_sizes(config)["experts"]
        k = getattr(moe, "k", None) or getattr(moe, "top_k", None) or config.num_experts_per_tok
        idle += sum(p.numel() for p in experts.parameters()) * (routed - k) // routed
    return sum(p.numel() for p in model.parameters()) - idle


def world_peak_flops(args, model, seq_len: int, world_size: int) -> float:
    """The world's peak FLOP/s the MFU is against: `--peak-flops` per rank, or under `--log`
    rank 0's float32 matmul at the model's sizes (a micro-batch's tokens by hidden by
    hidden), per core, times the cores the ranks share (`bench.peak_flops`); else 0."""
    if args.peak_flops:
        return args.peak_flops * world_size
    if not args.log:
        return 0.0
    hidden = getattr(getattr(model, "config", None), "hidden_size", 256)
    mine = peak_flops(
        matmul_flops(args.micro_batch * seq_len, hidden, hidden),
        world_size,
        on_gpu=rank_device().type == "cuda",
    )
    everyone = [None] * world_size
    comm.all_gather_object(everyone, mine, tag="log")  # rank 0's measure for everyone
    return everyone[0]


def _resume(args, engine, layout: dict):
    path = None
    if args.resume:  # rank 0 finds the newest complete save; every rank loads that one
        mine = None
        if dist.get_rank() == 0:
            try:
                mine = newest(args.resume, finish=True)
            except OSError as e:  # every rank gets it, none waits for rank 0 in a collective
                mine = CheckpointError(f"--resume {args.resume}: {e}")
        found = [None] * dist.get_world_size()
        comm.all_gather_object(found, mine, tag="checkpoint")
        if isinstance(found[0], CheckpointError):
            raise found[0]
        path = found[0]
    if path is None:
        return TrainingState(), None
    refuse_another_run(path, layout)
    report = load(path, engine.state_pieces(), layout)
    engine.finish_state_load()
    if report.state.samples % args.global_batch:
        raise ValueError(
            f"--resume {path}: its sample index {report.state.samples} is not a "
            f"whole number of --global-batch={args.global_batch} batches"
        )
    if report.rng_restored:
        restore_rng(report.state.rng, engine.module)
    return report.state, report


def _keep_last(args, grid) -> None:
    """`--keep-last N`: rank 0 removes the older complete saves beyond the newest N (one it
    cannot remove is a warning: the run goes on, the other ranks never wait for rank 0)."""
    if args.keep_last and grid.rank == 0:
        try:
            keep_last(args.save, args.keep_last)
        except OSError as e:
            warnings.warn(
                f"--keep-last={args.keep_last}: an older save in {args.save} "
                f"could not be removed ({e})",
                RuntimeWarning,
                stacklevel=2,
            )


def evaluate(engine, grid, data: TokenData, args) -> float:
    """The held-out split's mean loss (nats per token) over `--eval-batches` batches: the
    engine's forwards only (`eval_step`), nothing of the training state touched."""
    rows = data_rows(grid, args.global_batch)
    losses = [
        eval_step(engine, grid, *data.eval_batch(j, rows, args.global_batch))
        for j in range(args.eval_batches)
    ]
    return sum(losses) / len(losses)


def _log(args, engine, grid, state, record: dict, ledger, psi, peak, tokens) -> None:
    mine = (memory_by_kind(engine), bytes_by_kind(ledger, grid))
    everyone = [None] * grid.dims.world_size
    comm.all_gather_object(everyone, mine, tag="log")
    if grid.rank != 0:
        return
    seconds = record["seconds"]
    flops = 6 * psi * tokens / seconds
    line = {
        "step": state.step,
        "samples": state.samples,
        **record,
        "tokens_per_s": tokens / seconds,
        "model_flops_per_s": flops,
        "mfu": flops / peak,
        "peak_flops": peak,
        "peak_flops_per_rank": peak / grid.dims.world_size,
        "peak_from": "--peak-flops" if args.peak_flops else "matmul measured here",
        "memory_per_rank": [m for m, _ in everyone],
        "bytes_per_rank": [b for _, b in everyone],
    }
    with open(args.log, "a") as f:
        f.write(json.dumps(line) + "\n")


def params_sha256(params: dict[str, torch.Tensor]) -> str:
    """One digest of whole tensors (to compare runs bit for bit)."""
    digest = hashlib.sha256()
    for name in sorted(params):
        digest.update(params[name].contiguous().numpy().tobytes())
    return digest.hexdigest()


def train_rank(args, dims: dict, progress=None, after_step=None) -> dict:
    """On every rank of a world of `dims`' size: the run of `args` (see the module)."""
    # build
    pdims = ParallelDims(**dims)
    data, config, optim = prepare(args)
    model = build_model(config, args.seed).to(rank_device())
    psi, tokens = active_parameters(model), args.global_batch * data.seq_len
    # parallelize
    grid = Grid(pdims)
    d = pdims.dp_replicate * pdims.dp_shard
    if args.global_batch % (d * args.micro_batch):
        raise ValueError(
            f"global_batch={args.global_batch} must divide by dp_replicate·"
            f"dp_shard·micro_batch = {d}·{args.micro_batch}"
        )
    engine = parallelize(
        model,
        pdims,
        grid=grid,
        precision=args.precision,
        microbatches=args.global_batch // (d * args.micro_batch),
        recompute=args.recompute,
        dp_shard_mode=args.dp_shard_mode,
        reshard_after_forward=not args.no_reshard_after_forward,
        seq_len=data.seq_len,
        valid_token_mean=data.ignores or None,  # -100 targets: a transformers model's loss
        optimizer_cpu_offload=args.optimizer_cpu_offload,
        **engine_options(optim),
    )
    engine.measure_activations = True
    speed = args.moe_bias_update_speed
    if speed:  # lesson 19: DeepSeek-V3's routing bias, on the load this step routed
        count_expert_load(engine, required=False)  # checked in the parent
    # load
    layout = layout_of(args, dims, config, data.identity())
    state, report = _resume(args, engine, layout)
    resumed_from = state.step
    show = progress(resumed_from, tokens) if progress is not None else None
    saver = AsyncSaver() if args.async_save and args.save else None
    peak = world_peak_flops(args, model, data.seq_len, pdims.world_size)
    # loop
    rows = data_rows(grid, args.global_batch)  # this data rank's rows of every batch
    losses, norms, times, ledgers, evals, samples = [], [], [], [], [], []
    moved: dict[str, int] = {}  # the last step's copies over the bus (offloaded)
    while state.step < args.steps:
        index = state.samples // args.global_batch
        x, y = data.batch(index, rows, args.global_batch)
        lr = optim.lr_at(state.step, args.steps)
        before = engine.moved()
        loss, seconds, ledger, norm = one_step(engine, grid, x, y, lr, optim.clip_grad)
        moved = {way: n - before[way] for way, n in engine.moved().items()}
        if speed:
            update_routing_bias(engine, speed, load_group(engine))
        state = TrainingState(state.step + 1, state.samples + args.global_batch)
        losses.append(loss)
        times.append(seconds)
        ledgers.append(ledger)
        samples.append(index)
        record = {"loss": loss, "seconds": seconds, "lr": lr}
        if norm is not None:
            record["grad_norm"] = norm
            norms.append(norm)
        if args.eval_every and (state.step % args.eval_every == 0 or state.step == args.steps):
            record["eval_loss"] = evaluate(engine, grid, data, args)
            record["perplexity"] = math.exp(min(record["eval_loss"], 700.0))
            evals.append((state.step, record["eval_loss"]))
        due = args.save_every and state.step % args.save_every == 0
        if args.save and (due or state.step == args.steps):
            kept = TrainingState(state.step, state.samples, rng=capture_rng(engine.module))
            path = step_path(args.save, state.step) if args.keep_last else args.save
            start = time.perf_counter()
            if saver is not None:
                saver.save(path, engine.state_pieces(), kept, layout)
            else:
                save(path, engine.state_pieces(), kept, layout)
            record["save_blocked_s"] = time.perf_counter() - start
            _keep_last(args, grid)  # the saves in place (async: all but this one)
        if args.log:
            _log(args, engine, grid, state, record, ledger, psi, peak, tokens)
        if show is not None:
            mfu = 6 * psi * tokens / seconds / peak if peak else None
            show(loss, seconds, record.get("eval_loss"), mfu)
        if after_step is not None:
            after_step(state.step, grid)
    if saver is not None:
        saver.close()
        _keep_last(args, grid)
    # export
    params, buffers = engine.full_parameters(), engine.full_buffers()
    if args.export_hf and grid.rank == 0:
        export_hf({**params, **buffers}, config, args.export_hf)
    return {
        "losses": losses,
        "norms": norms,
        "evals": evals,
        "samples": samples,
        "step": state.step,
        "resumed_from": resumed_from,
        "params": params,
        "buffers": buffers,
        "optim": engine.full_optimizer_state(),
        "params_sha256": params_sha256(params),
        "bytes": {
            **(bytes_by_kind(ledgers[-1], grid) if ledgers else {}),
            **(moved if engine.offload else {}),
        },
        "memory": memory_by_kind(engine),
        "step_s": sorted(times)[len(times) // 2] if times else float("nan"),
        "read": None if report is None else (report.bytes_read, report.shard_bytes),
        "tokens_per_step": tokens,
    }


def reference(args) -> dict:
    """The same run in one process (`--compare`, the tests): the same model and rows,
    torch's optimizer, schedule and clipping (`compose.fixture.train_one_process`); with
    the model's persistent buffers (`buffers`: what is in its state dict beside the
    parameters)."""
    data, config, optim = prepare(args)
    model = build_model(config, args.seed).to(rank_device())
    every = range(args.global_batch)
    batches = (data.batch(i, every, args.global_batch) for i in range(args.steps))
    after_step = None
    if args.moe_bias_update_speed:
        count_expert_load(model)
        after_step = lambda: update_routing_bias(model, args.moe_bias_update_speed)  # noqa: E731
    out = train_one_process(model, batches, optim, after_step)
    weights = dict(model.named_parameters(remove_duplicate=False))
    state = model.state_dict().items()
    out["buffers"] = {n: t.cpu().clone() for n, t in state if n not in weights}
    return out
