"""The rank functions lessons 07 and 08's notebooks, tests and tour share.

The model is lesson 01's GPT with 4 heads (`build("gpt", heads=4)`: hidden 32, 2 layers,
vocabulary 30, a tied embedding and a frozen `ln_f.bias`), so that tp = 2 and 4 both divide
the heads, the hidden size and 4·hidden, and at tp = 4 the vocabulary needs padding (30 to
32). Its global batches are the same everywhere; SGD with momentum is the optimizer.

- `reference`: the dense GPT trained in one process.
- `train_on_rank`: `TensorParallelGPT` on a tp group of the whole world (every rank sees the
  whole batch), with its ledger, memory and the gradients of its replicated parameters.
- `layout_train_on_rank`: lesson 08's layout, TP inside and DP across: a `ParallelLayout`
  (tp × dp), `TensorParallelGPT` on the tp group, lesson 01's `BucketedDataParallel` around
  it on the dp group, each tp group training on its data-parallel slice of the batch.
- `ledger_by_part_on_rank`: one step, each all-reduce attributed to the part of the model
  (embedding, block i, head, loss) and the phase (forward, backward) it ran in.
- `dropout_streams_on_rank`: random numbers drawn inside and outside a tensor-parallel region.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import comm
from ..data import shard_batch
from ..data_parallel import BucketedDataParallel
from ..data_parallel.fixture import STEPS, Fixture, build  # noqa: F401 (STEPS: re-exported)
from ..memory import ModelStateBytes, model_state_bytes
from ..training import TrainTrace, make_optimizer, max_abs_diff, train
from . import theory
from .layers import TensorParallelRNG
from .layout import ParallelLayout
from .model import TensorParallelGPT

TP_GPT = dict(heads=4)  # 4 heads: divisible by tp = 2 and 4; vocab 30 needs padding at tp=4
# float32: the all-reduces sum t partial products in another order than one matmul does
# (a few ulps); 5 SGD-with-momentum steps keep that at the 1e-6 level.
LOSS_TOL, GRAD_TOL, PARAM_TOL = 1e-5, 1e-6, 1e-5
# The comparison contract's gathers (`full_grads()` every step, `full_parameters()` at the
# end, tagged by `gather_split`): a check, not training traffic.
CONTRACT_TAG = "full-state"


def build_dense(**sizes) -> Fixture:
    """Lesson 01's GPT with 4 heads, its global batches and loss (`sizes` override)."""
    return build("gpt", **{**TP_GPT, **sizes})


def reference(**sizes) -> TrainTrace:
    """The dense GPT trained with SGD + momentum in one process on the whole batches."""
    model, batches, loss_fn = build_dense(**sizes)
    return train(model, batches, loss_fn, make_optimizer(model.parameters()))


def frozen_params(model: nn.Module) -> int:
    """Elements of the parameters without a gradient (the GPT's `ln_f.bias`, replicated)."""
    return sum(p.numel() for p in model.parameters() if not p.requires_grad)


def memory_theory(tp: int, **sizes) -> int:
    """Model-state bytes one rank of `TensorParallelGPT` holds at `tp`, from the formula."""
    model = build_dense(**sizes).model
    cfg = model.cfg
    return theory.model_state_bytes_per_rank(
        cfg.layers, cfg.hidden, cfg.vocab_size, cfg.seq_len, tp, frozen_params(model)
    )


def training_records(ledger: comm.Ledger) -> list[comm.CommRecord]:
    """The ledger's records less the comparison contract's gathers."""
    return [r for r in ledger.records if r.tag != CONTRACT_TAG]


def compare(trace: TrainTrace, ref: TrainTrace, losses: list[float] | None = None) -> dict:
    """Largest differences of losses, last gradients and final parameters from `ref`.

    `losses` replaces `trace.losses` (lesson 08: a dp rank's loss is its slice's; the
    global batch's is the mean over the dp ranks, `dp_mean_losses`).
    """
    got = torch.tensor(trace.losses if losses is None else losses, device="cpu")
    return dict(
        loss=float((got - torch.tensor(ref.losses, device="cpu")).abs().max()),
        grad=max_abs_diff(trace.grads, ref.grads),
        param=max_abs_diff(trace.params, ref.params),
    )


def matches(diffs: dict[str, float]) -> bool:
    """Within the tolerances above."""
    return diffs["loss"] < LOSS_TOL and diffs["grad"] < GRAD_TOL and diffs["param"] < PARAM_TOL


class TPRun(NamedTuple):
    trace: TrainTrace
    records: list[comm.CommRecord]  # training only (no contract gathers)
    replicated_grads: dict[str, torch.Tensor]  # last gradients of the unsplit parameters
    params: int  # parameters this rank holds
    memory: ModelStateBytes  # after the last step
    vocab_range: tuple[int, int]  # this rank's rows [start, stop) of the padded vocabulary
    padding_grad: float | None  # largest |gradient| of this rank's padding rows (None: none)


def train_on_rank(**sizes) -> TPRun:
    """On a rank: `TensorParallelGPT` over the whole world (tp = N), SGD + momentum."""
    model, batches, _ = build_dense(**sizes)
    layout = ParallelLayout(tp=dist.get_world_size())
    tp = TensorParallelGPT(model, layout.group("tp"))
    opt = make_optimizer(tp.parameters())
    with comm.record() as ledger:
        trace = train(tp, batches, tp.loss, opt)
    replicated = {
        n: p.grad.clone()
        for n, p in tp.module.named_parameters()
        if p.grad is not None and not hasattr(p, "tp_split")
    }
    emb = tp.module.tok_emb
    pad_rows = emb.weight.grad[max(0, emb.vocab_size - emb.start) :]
    return TPRun(
        trace=trace,
        records=training_records(ledger),
        replicated_grads=replicated,
        params=sum(p.numel() for p in tp.parameters()),
        memory=model_state_bytes(tp, opt),
        vocab_range=(emb.start, emb.start + emb.per_rank),
        padding_grad=float(pad_rows.abs().max()) if pad_rows.numel() else None,
    )


class LayoutRun(NamedTuple):
    trace: TrainTrace
    records: list[comm.CommRecord]  # training only (no contract gathers)
    mine: dict[str, list[int]]  # this rank's tp, pp, dp, ... groups
    coords: tuple[int, int]  # (tp rank, dp rank)
    memory: ModelStateBytes
    trainable: int  # trainable parameter elements this rank holds (what DP all-reduces)


def layout_train_on_rank(tp: int, bucket_cap_mb: float = 25.0, **sizes) -> LayoutRun:
    """On a rank of N = tp·dp: TP inside (tp groups of consecutive ranks), DP across.

    The tp group trains `TensorParallelGPT` on its data-parallel slice of every batch;
    lesson 01's `BucketedDataParallel` around it all-reduces each rank's split gradients
    over its dp group (the ranks that hold the same slices). `train` reads the full state
    through the tensor-parallel model's comparison contract.
    """
    model, batches, _ = build_dense(**sizes)
    layout = ParallelLayout(tp=tp)
    tp_model = TensorParallelGPT(model, layout.group("tp"))
    ddp = BucketedDataParallel(tp_model, group=layout.group("dp"), bucket_cap_mb=bucket_cap_mb)
    opt = make_optimizer(tp_model.parameters())
    local = [shard_batch(b, layout.dp_rank, layout.dp_size) for b in batches]
    with comm.record() as ledger:
        trace = train(tp_model, local, tp_model.loss, opt, forward=ddp)
    return LayoutRun(
        trace=trace,
        records=training_records(ledger),
        mine=layout.mine,
        coords=(layout.tp_rank, layout.dp_rank),
        memory=model_state_bytes(tp_model, opt, extra_grads=[b.buffer for b in ddp.buckets]),
        trainable=sum(p.numel() for p in tp_model.parameters() if p.requires_grad),
    )


def dp_mean_losses(runs: list[LayoutRun]) -> list[float]:
    """Per step, the loss of the whole global batch: the mean of the dp ranks' losses (each
    rank's `trace.losses` is its own slice's, equal slices), from tp rank 0 of each."""
    mine = [r.trace.losses for r in runs if r.coords[0] == 0]
    return [sum(step) / len(mine) for step in zip(*mine)]


def ledger_by_part_on_rank(**sizes) -> list[tuple[str, str, str, int]]:
    """On a rank (tp = N): one training step; every all-reduce as (part, phase, tag, elements).

    Parts are found with module hooks, not assumed: the token embedding and each block in
    forward (forward pre-hook to forward hook), each block in backward (full backward
    pre-hook to backward hook); what runs outside them is the head (its f, in backward)
    or, between the model's forward and backward, the loss (the vocab-parallel cross
    entropy).
    """
    model, batches, _ = build_dense(**sizes)
    tp = TensorParallelGPT(model, ParallelLayout(tp=dist.get_world_size()).group("tp"))
    marks: list[tuple[int, str | None]] = []  # (index in the ledger, part from there on)
    with comm.record() as ledger:

        def enter(name):
            return lambda *_: marks.append((len(ledger.records), name))

        def leave(*_):
            marks.append((len(ledger.records), None))

        parts = [("embedding", tp.module.tok_emb)]
        parts += [(f"block {i}", b) for i, b in enumerate(tp.module.blocks)]
        for name, module in parts:
            module.register_forward_pre_hook(enter(name))
            module.register_forward_hook(leave)
            if name != "embedding":  # its backward (g's) sends nothing; its input is ids
                module.register_full_backward_pre_hook(enter(name))
                module.register_full_backward_hook(leave)
        x, y = batches[0]
        logits = tp(x)
        after_forward = len(ledger.records)
        loss = tp.loss(logits, y)
        after_loss = len(ledger.records)
        loss.backward()
    rows = []
    for i, r in enumerate(ledger.records):
        part = None
        for index, name in marks:
            if index > i:
                break
            part = name
        phase = "forward" if i < after_loss else "backward"
        if part is None:
            part = "loss" if after_forward <= i < after_loss else "head"
        rows.append((part, phase, r.tag, r.payload_bytes // 4))
    return rows


def dropout_streams_on_rank(seed: int = 0, draws: int = 2) -> tuple[list, torch.Tensor]:
    """On a rank: `draws` dropout masks inside a tensor-parallel region (this tp rank's
    stream, `TensorParallelRNG.fork`), then one outside (the default generator, seeded
    alike on every rank)."""
    rng = TensorParallelRNG(seed=seed, group=None)
    torch.manual_seed(seed + 1)
    with rng.fork():
        inside = [(torch.rand(8, device="cpu") > 0.5).int() for _ in range(draws)]
    outside = (torch.rand(8, device="cpu") > 0.5).int()
    return inside, outside
