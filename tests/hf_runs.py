"""Worlds that train real transformers models composed, and the same in one process."""

from __future__ import annotations

import hf_models
import torch
import torch.nn.functional as F
from micro_batches import lean_micro_batch, lean_microbatches

from minidist.compose.dims import Grid, ParallelDims
from minidist.compose.fixture import bytes_by_kind, data_rows, one_step
from minidist.compose.parallelize import parallelize

LR, STEPS, BATCH, SEQ = 1e-2, 3, 8, 16


def shifted(labels: torch.Tensor) -> torch.Tensor:
    """The model's causal shift: position i predicts label i + 1 (the last predicts none)."""
    return F.pad(labels[:, 1:], (0, 1), value=-100)


def reference(
    name: str, steps: int = STEPS, seq: int = SEQ, prepare=None, after_step=None, **extra
) -> dict:
    """The untouched model trained in one process: its own loss, Adam at LR; `prepare(model)`
    before the first step, `after_step(model)` after each (its results in "after")."""
    model = hf_models.build(name, **extra)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    if prepare is not None:
        prepare(model)
    losses, after = [], []
    for ids, labels in hf_models.batches(steps, BATCH, seq):
        opt.zero_grad()
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        for p in model.parameters():
            if p.grad is None:  # as ZeRO's flat buffer: a zero gradient, still a step
                p.grad = torch.zeros_like(p)
        opt.step()
        if after_step is not None:
            after.append(after_step(model))
        losses.append(loss.item())
    names = {p: n for n, p in model.named_parameters()}
    optim = {
        f"optim.{names[p]}.{k}": v.detach().clone()
        for p, state in opt.state.items()
        for k, v in state.items()
    }
    return {
        "losses": losses,
        "optim": optim,
        "after": after,
        "model": model,
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
    }


def composed(
    name: str,
    dims: dict,
    steps: int = STEPS,
    seq: int = SEQ,
    micro_batch: int | None = None,
    precision: str = "fp32",
    recompute: bool = False,
    dp_shard_mode: str = "optim",
    **extra,
) -> dict:
    """On every rank of a world of `dims`' size: the same run, composed (None: the
    micro-batch of `lean_micro_batch`)."""
    micro_batch = micro_batch or lean_micro_batch(dims, BATCH)
    pdims = ParallelDims(**dims)
    grid = Grid(pdims)
    model = hf_models.build(name, **extra)
    m = BATCH // (pdims.dp_replicate * pdims.dp_shard * micro_batch)
    engine = parallelize(
        model,
        pdims,
        grid=grid,
        microbatches=m,
        seq_len=seq,
        lr=LR,
        precision=precision,
        recompute=recompute,
        dp_shard_mode=dp_shard_mode,
    )
    rows = list(data_rows(grid, BATCH))
    losses = []
    for ids, labels in hf_models.batches(steps, BATCH, seq):
        losses.append(one_step(engine, grid, ids[rows], shifted(labels)[rows])[0])
    return {
        "losses": losses,
        "params": engine.full_parameters(),
        "optim": engine.full_optimizer_state(),
    }


def step_bytes(runs) -> list[tuple[float, float]]:
    """Per (name, dims, recompute): this rank's tp and cp bytes in one step of the first batch."""
    out = []
    for name, dims, recompute in runs:
        pdims = ParallelDims(**dims)
        grid = Grid(pdims)
        m = lean_microbatches(dims, BATCH)
        model = hf_models.build(name)
        options = dict(microbatches=m, seq_len=SEQ, lr=LR, recompute=recompute)
        engine = parallelize(model, pdims, grid=grid, **options)
        ids, labels = hf_models.batches(1, BATCH, SEQ)[0]
        rows = list(data_rows(grid, BATCH))
        sent = bytes_by_kind(one_step(engine, grid, ids[rows], shifted(labels)[rows])[2], grid)
        out.append((sent["tp"], sent["cp"]))
    return out


def several(runs):
    """Several (name, dims, options) runs one after the other on one world."""
    return [composed(name, dims, **options) for name, dims, options in runs]


def sequence_parallel_records(name: str, tp: int, layers: int) -> list[tuple[str, float]]:
    """(tag, ring bytes) of every collective of activations of one step under tp (sp)."""
    from minidist import comm

    pdims = ParallelDims(tp=tp, sp=True)
    grid = Grid(pdims)
    engine = parallelize(
        hf_models.build(name, layers=layers), pdims, grid=grid, microbatches=1, seq_len=SEQ, lr=LR
    )
    ids, labels = hf_models.batches(1, BATCH, SEQ)[0]
    with comm.record() as ledger:
        engine.train_step((ids, shifted(labels)))
    activations = ("sp-gather", "sp-reduce-scatter", "sp-scatter")  # not the norms' gradients
    return [(r.tag, r.ring_bytes) for r in ledger.records if r.tag.startswith(activations)]


def padded_batches(steps: int = STEPS, batch: int = BATCH, seq: int = SEQ):
    """(ids, labels, attention mask): each row right-padded after a length drawn in [4, seq]."""
    g = torch.Generator().manual_seed(1)
    out = []
    for ids, labels in hf_models.batches(steps, batch, seq):
        lengths = torch.randint(4, seq + 1, (batch,), generator=g)
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
        out.append((ids.masked_fill(mask == 0, 0), labels.masked_fill(mask == 0, -100), mask))
    return out


def padded_reference(name: str) -> list[float]:
    model = hf_models.build(name)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    losses = []
    for ids, labels, mask in padded_batches():
        opt.zero_grad()
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def padded_composed(name: str, dims: dict) -> list[float]:
    """The padded batches, this data rank's rows, through `train_step((ids, targets, mask))`."""
    pdims = ParallelDims(**dims)
    grid = Grid(pdims)
    d = pdims.dp_replicate * pdims.dp_shard
    engine = parallelize(
        hf_models.build(name), pdims, grid=grid, microbatches=BATCH // d, seq_len=SEQ, lr=LR
    )
    rank = grid.coord["dp_replicate"] * pdims.dp_shard + grid.coord["dp_shard"]
    losses = []
    for ids, labels, mask in padded_batches():
        rows = slice(rank * BATCH // d, (rank + 1) * BATCH // d)
        engine.zero_grad()
        loss = engine.train_step((ids[rows], shifted(labels)[rows], mask[rows]))
        engine.finish_gradient_sync()
        engine.step()
        losses.append(loss)
    return losses
