"""What lesson 06's notebook, tests, checkers and tour measure: the course GPT with dropout,
its blocks run plainly, recomputed one by one, or in segments of k.

- `gpt_forward`, `saved_and_grads`, `block_bytes`: one forward/backward of `DROPOUT_GPT`
  (4 blocks, dropout 0.1 inside attention), the bytes saved and the gradients.
- `gpt_dims`: the (s, b, h, a) of a fixture, for the formulas of `theory.py`.
- `saved_by_part`, `block_saved_by_module`: what a forward saves, part by part.
- `block_chain`, `linear_chain`, `chain_bytes`: a chain of L layers with segments of k,
  measured over a whole step with `LiveActivations` (forward and peak).
- `train_recomputed`: the lesson 02/03 GPT with every block recomputed, trained with Adam in
  one process; `fsdp_on_rank`: the same under FSDP on a rank, with or without recompute.
- `timings`: forward and backward seconds and the peak of saved bytes, with and without
  recomputation; `cuda_peaks`: `torch.cuda.max_memory_allocated` where a GPU exists.

Blocks are recomputed in the reentrant form (`use_reentrant=True`, Chen et al.'s Function,
as `checkpoint` and `checkpoint_sequential` run by default): its saved inputs are what
`SavedActivations` and `LiveActivations` see, where the non-reentrant form (`recompute`'s
default) keeps them in a closure, out of autograd's sight.
"""

from __future__ import annotations

import statistics

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import comm
from ..data import shard_batch
from ..data_parallel.fixture import GPT_SIZES, build
from ..memory import SavedActivations
from ..training import TrainTrace, train
from .checkpoint import checkpoint_sequential, recompute
from .measure import LiveActivations, saved_by_module, time_forward_backward

DROPOUT_GPT = dict(layers=4, dropout=0.1)
GLOBAL_BATCH = 8  # build()'s default
# Bigger than the course GPT so that compute, not Python, dominates the timed steps.
TIMING_GPT = dict(layers=4, hidden=128, heads=4, seq_len=64, dropout=0.1)


def gpt_dims(global_batch: int = GLOBAL_BATCH, **sizes) -> dict[str, int]:
    """seq, batch, hidden, heads (Korthikanti's s, b, h, a) and layers of a GPT fixture."""
    cfg = {**GPT_SIZES, **sizes}
    return dict(
        seq=cfg["seq_len"],
        batch=global_batch,
        hidden=cfg["hidden"],
        heads=cfg["heads"],
        layers=cfg["layers"],
    )


def gpt_forward(model, x: torch.Tensor, segment: int | None = None) -> torch.Tensor:
    """The GPT's forward, its blocks in recomputed segments of `segment` (None: as is)."""
    if segment is None:
        return model(x)
    return model.lm_head(model.ln_f(checkpoint_sequential(model.blocks, segment, embed(model, x))))


def embed(model, x: torch.Tensor) -> torch.Tensor:
    """Token + position embeddings: the input of the first block."""
    return model.tok_emb(x) + model.pos_emb(torch.arange(x.shape[1], device=x.device))


def _dropout_gpt(how: str = "plain", **sizes):
    model, batches, loss_fn = build("gpt", **{**DROPOUT_GPT, **sizes})
    model.train()
    if how == "recompute":
        for block in model.blocks:
            recompute(block, use_reentrant=True)
    return model, batches, loss_fn


def saved_and_grads(how: str = "plain", segment: int | None = None, seed: int = 123):
    """One forward/backward in train mode (dropout on): (bytes saved for backward during
    forward, gradients). `how`: "plain", "recompute" (every block, in place), "segments"."""
    model, batches, loss_fn = _dropout_gpt(how)
    x, y = batches[0]
    torch.manual_seed(seed)
    with SavedActivations(model) as saved:
        loss = loss_fn(gpt_forward(model, x, segment if how == "segments" else None), y)
    loss.backward()
    return saved.bytes, {
        n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }


def block_bytes() -> tuple[int, int]:
    """(bytes one block saves for backward, bytes of its input) on the fixture's batch."""
    model, batches, _ = build("gpt", **DROPOUT_GPT)
    h = embed(model, batches[0][0])
    with SavedActivations(model) as saved:
        model.blocks[0](h)
    return saved.bytes, h.numel() * h.element_size()


def _part(name: str) -> str:
    """A module name -> its part of the GPT: "blocks.2.attn.qkv" -> "block 2"."""
    if name == "":
        return "loss"
    top = name.split(".")
    return f"block {top[1]}" if top[0] == "blocks" else top[0]


def saved_by_part(how: str = "plain", seed: int = 123) -> dict[str, int]:
    """Bytes one forward (with the loss) of `DROPOUT_GPT` saves, by part: tok_emb, pos_emb,
    block 0..L-1, ln_f, lm_head, loss. `how`: "plain" or "recompute" (every block)."""
    model, batches, loss_fn = _dropout_gpt(how)
    x, y = batches[0]
    torch.manual_seed(seed)
    by_module = saved_by_module(model, lambda: loss_fn(model(x), y))
    order = ["tok_emb", "pos_emb", *(f"block {i}" for i in range(len(model.blocks)))]
    out = {part: 0 for part in [*order, "ln_f", "lm_head", "loss"]}
    for name, nbytes in by_module.items():
        out[_part(name)] += nbytes
    return out


def block_saved_by_module(dropout: bool = True) -> dict[str, int]:
    """Bytes one block of the course GPT saves, by submodule ("attn" alone is the attention
    core between its two Linear layers: scaled_dot_product_attention and the reshapes)."""
    model, batches, _ = build("gpt", **{**DROPOUT_GPT, "dropout": 0.1 if dropout else 0.0})
    model.train()
    h = embed(model, batches[0][0]).detach().requires_grad_()
    return saved_by_module(model.blocks[0], lambda: model.blocks[0](h))


def chain_bytes(layers, x: torch.Tensor, segment: int | None, params=()) -> dict[str, int]:
    """Run `layers` in order on `x` (segments of `segment` recomputed, None: plainly), then
    backward: bytes saved at the end of forward and the most held at once during the step."""
    with LiveActivations(exclude=params) as live:
        out = checkpoint_sequential(layers, segment, x) if segment else nn.Sequential(*layers)(x)
        forward = live.live
        out.backward(torch.ones_like(out))  # no loss: nothing else is saved
    return {"forward": forward, "peak": live.peak}


def block_chain(layers: int, segment: int | None, seed: int = 123) -> dict[str, int]:
    """`chain_bytes` for `layers` blocks of `DROPOUT_GPT` on its first batch's embeddings."""
    model, batches, _ = _dropout_gpt(layers=layers)
    h = embed(model, batches[0][0]).detach().requires_grad_()
    torch.manual_seed(seed)
    return chain_bytes(model.blocks, h, segment, params=list(model.parameters()))


def linear_chain(layers: int, segment: int | None, width: int = 64, batch: int = 16) -> dict:
    """`chain_bytes` for `layers` Linear(width, width) layers: each saves only its input, so
    a layer keeps exactly what it receives (M_act = M_in, Chen et al.'s setting)."""
    torch.manual_seed(0)
    chain = [nn.Linear(width, width, bias=False) for _ in range(layers)]
    params = [layer.weight for layer in chain]
    x = torch.randn(batch, width, requires_grad=True, device="cpu")
    return chain_bytes(chain, x, segment, params=params)


def train_recomputed(name: str = "gpt") -> TrainTrace:
    """Lesson 02/03's GPT with every block recomputed, trained in one process with Adam
    (compare with `minidist.zero.fixture.reference`)."""
    from ..zero.fixture import ADAM

    model, batches, loss_fn = build(name)
    for block in model.blocks:
        recompute(block, use_reentrant=True)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], **ADAM)
    return train(model, batches, loss_fn, opt)


def local_plain_saved(world_size: int, rank: int = 0) -> tuple[int, int]:
    """(bytes lesson 02/03's GPT saves in one process on rank `rank`'s slice of the first
    batch, forward and loss, without recomputation; that slice's batch size)."""
    model, batches, loss_fn = build("gpt")
    x, y = shard_batch(batches[0], rank, world_size)
    with SavedActivations(model) as saved:
        loss_fn(model(x), y)
    return saved.bytes, x.shape[0]


def fsdp_on_rank(recomputed: bool) -> dict:
    """On a rank: lesson 03's FSDP (a unit per block) with Adam, every block recomputed or
    not. Returns the trace, bytes sent per training step (the comparison contract's gathers
    left out), the unit sizes, and, for one more step on the first batch, the activation
    bytes saved in forward and the most held at once during the step."""
    from ..fsdp.fixture import UNITS
    from ..fsdp.fully_sharded import FullyShardedDataParallel
    from ..fsdp.lesson import training_bytes_per_step
    from ..zero.fixture import ADAM

    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build("gpt")
    if recomputed:
        for block in model.blocks:
            recompute(block, use_reentrant=True)
    fsdp = FullyShardedDataParallel(model, wrap=UNITS["gpt"])
    opt = torch.optim.Adam(fsdp.sharded_parameters(), **ADAM)
    local = [shard_batch(b, rank, world) for b in batches]
    with comm.record() as ledger:
        trace = train(fsdp, local, loss_fn, opt)
    x, y = local[0]
    opt.zero_grad()
    with LiveActivations(model, exclude=[u.full for u in fsdp.units]) as live:
        loss = loss_fn(fsdp(x), y)
        forward = live.live
        loss.backward()
    fsdp.finish_gradient_sync()
    return dict(
        trace=trace,
        sent=training_bytes_per_step(ledger, len(local)),
        numels=[u.numel for u in fsdp.units],
        forward=forward,
        peak=live.peak,
    )


SETTINGS = {  # label -> (how, segment) for `timings`
    "plain": ("plain", None),
    "every block": ("recompute", None),
    "segments of 2": ("segments", 2),
    "one segment of 4": ("segments", 4),
}


def timings(settings: dict = SETTINGS, rounds: int = 15, warmup: int = 2, **sizes) -> dict:
    """{label: median forward and backward seconds, extra, peak} for `TIMING_GPT` (or `sizes`)
    in train mode, each setting (how, segment) as in `saved_and_grads`.

    The settings take turns within each round (in a rotating order), so that a machine
    busy with something else for a while slows them all alike. `extra` is the median over
    rounds of (this setting's step - the first setting's step) / the first setting's
    forward, in the same round: how many forwards the setting adds. `peak`: the most saved
    bytes held at once over one more step (`LiveActivations`). Timed on one thread: on a
    shared CPU, several threads spinning on busy cores slow a step by 10x or more."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _timings(settings, rounds, warmup, sizes)
    finally:
        torch.set_num_threads(threads)


def _timings(settings: dict, rounds: int, warmup: int, sizes: dict) -> dict:
    runs = {}
    for label, (how, segment) in settings.items():
        model, batches, loss_fn = build("gpt", **{**TIMING_GPT, **sizes})
        model.train()
        if how == "recompute":
            for block in model.blocks:
                recompute(block, use_reentrant=True)
        x, y = batches[0]
        k = segment if how == "segments" else None
        step = lambda m=model, k=k, x=x, y=y, f=loss_fn: f(gpt_forward(m, x, k), y)
        runs[label] = (model, step)
    labels = list(runs)
    times: dict[str, list[dict]] = {label: [] for label in labels}
    for r in range(warmup + rounds):
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            t = time_forward_backward(runs[label][1], repeats=1, warmup=0)
            if r >= warmup:
                times[label].append(t)
    first = times[labels[0]]
    out = {}
    for label, (model, step) in runs.items():
        with LiveActivations(model) as live:
            step().backward()
        ts = times[label]
        extra = [(t["step"] - f["step"]) / f["forward"] for t, f in zip(ts, first)]
        f, b = (statistics.median(t[p] for t in ts) for p in ("forward", "backward"))
        out[label] = {
            "forward": f,
            "backward": b,
            "step": f + b,
            "extra": statistics.median(extra),
            "peak": live.peak,
        }
    return out


def cuda_peaks(repeats: int = 3, **sizes) -> dict[str, int] | None:
    """On a GPU: `torch.cuda.max_memory_allocated` over a step of `TIMING_GPT` (or `sizes`)
    in train mode, plain and with every block recomputed, beyond what the model and its
    gradients take. None without a GPU."""
    if not torch.cuda.is_available():
        return None
    out = {}
    for how in ("plain", "recompute"):
        model, batches, loss_fn = build("gpt", **{**TIMING_GPT, **sizes})
        model.cuda().train()
        if how == "recompute":
            for block in model.blocks:
                recompute(block, use_reentrant=True)
        x, y = (t.cuda() for t in batches[0])
        for _ in range(repeats):  # gradients exist after the first step
            model.zero_grad(set_to_none=False)
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            loss_fn(model(x), y).backward()
            torch.cuda.synchronize()
        out[how] = torch.cuda.max_memory_allocated() - base
        del model
        torch.cuda.empty_cache()
    return out
