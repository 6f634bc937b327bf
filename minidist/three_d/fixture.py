"""Lesson 10's rank function, shared by the tour row, the notebook and the tests.

`measured_on_rank(tp, pp)` is `run.train_3d` (the course GPT, 20 steps of SGD with momentum
through ZeRO-1 over dp, 1F1B over 4 micro-batches) with the ledger open around the steps and
the model state measured after the last backward: bytes sent per step by group kind, the
rank's parameters, its memory. `reference_losses` and `reference_params` are the same GPT
trained in one process.
"""

from __future__ import annotations

import torch

from .. import comm
from ..data import shard_batch
from ..data_parallel.fixture import build
from ..megatron.layout import ParallelLayout
from ..memory import model_state_bytes
from ..training import make_optimizer, train
from ..zero.optimizer import ZeroRedundancyOptimizer
from . import theory
from .parallel import ThreeDParallel
from .run import GPT_3D, MICROBATCHES, reference_losses

# float32 with SGD + momentum (tests/test_three_d.py): tensor-parallel all-reduces,
# micro-batch accumulation and the data-parallel reduce-scatter each sum in another order than
# one process; over 20 steps losses and parameters stay within 1e-5 (measured 5e-7).
LOSS_TOL, PARAM_TOL = 1e-5, 1e-5
# Records that are not the technique's communication: the comparison contract's gathers, the
# loss's broadcast along the pipeline and its mean over the replicas.
EXCLUDED_TAGS = ("full-state", "pp-loss", "loss")

__all__ = ["GPT_3D", "LOSS_TOL", "PARAM_TOL", "measured_on_rank", "reference_losses"]


def sizes() -> dict:
    """The GPT's sizes: layers, hidden, vocab, seq, global batch."""
    model, batches, _ = build("gpt", **GPT_3D)
    cfg = model.cfg
    return dict(
        layers=cfg.layers,
        hidden=cfg.hidden,
        vocab=cfg.vocab_size,
        seq=batches[0][0].shape[1],
        batch=batches[0][0].shape[0],
    )


def frozen() -> int:
    """Elements without a gradient (the GPT's `ln_f.bias`, on the last stage)."""
    model = build("gpt", **GPT_3D)[0]
    return sum(p.numel() for p in model.parameters() if not p.requires_grad)


def theory_for(stage: int, tp: int, pp: int, dp: int) -> dict:
    """theory.py's numbers for a rank of stage `stage` of this GPT: bytes per step by group
    kind, parameters, trainable parameters and model-state bytes."""
    s, f = sizes(), frozen()
    shape = (s["layers"], s["hidden"], s["vocab"], s["seq"], tp)
    params = theory.params_per_rank(stage, pp, *shape)
    trainable = theory.trainable_per_rank(stage, pp, *shape, frozen=f)
    return {
        "sent": theory.bytes_sent_per_step(
            stage, pp, s["layers"], s["batch"], s["seq"], s["hidden"], s["vocab"], tp, dp, f
        ),
        "params": params,
        "trainable": trainable,
        "memory": theory.model_state_bytes_per_rank(params, trainable, dp),
    }


def reference_params() -> dict[str, torch.Tensor]:
    model, batches, loss_fn = build("gpt", **GPT_3D)
    return train(model, batches, loss_fn, make_optimizer(model.parameters())).params


def group_kind(rec: comm.CommRecord, layout: ParallelLayout) -> str:
    """tp, pp or dp: which of this rank's groups a record went over (sends: "pp")."""
    if rec.op in ("send", "recv"):
        return "pp"
    ranks = list(rec.group_ranks)
    for kind in ("tp", "dp", "embedding", "pp"):
        if layout.mine.get(kind) == ranks:
            return "pp" if kind == "embedding" else kind
    return "other"


def measured_on_rank(tp: int = 2, pp: int = 2) -> dict:
    """`train_3d` with the ledger and the model state measured."""
    model, batches, _ = build("gpt", **GPT_3D)
    layout = ParallelLayout(tp=tp, pp=pp)
    pipe = ThreeDParallel(model, layout, "1f1b", MICROBATCHES)
    dp = layout.group("dp")  # one rank's own group when d = 1 (None would be the world)
    opt = ZeroRedundancyOptimizer(
        pipe.module.parameters(), torch.optim.SGD, group=dp, lr=0.05, momentum=0.9
    )
    losses = []
    with comm.record() as ledger:
        for batch in batches:
            opt.zero_grad()
            local = shard_batch(batch, layout.dp_rank, layout.dp_size)
            losses.append(pipe.train_step(local))
            opt.step()
    memory = model_state_bytes(
        pipe.module, opt.inner, extra_params=[opt.shard], extra_grads=[opt.shard.grad]
    )
    mean = torch.tensor(losses, device=comm.group_device(dp))
    if layout.dp_size > 1:  # every replica's loss is its slice's: the mean is the batch's
        comm.all_reduce(mean, group=dp, tag="loss")
        mean /= layout.dp_size
    sent = {kind: 0.0 for kind in ("tp", "pp", "dp", "other")}
    for rec in ledger.records:
        if rec.tag not in EXCLUDED_TAGS:
            sent[group_kind(rec, layout)] += rec.ring_bytes / len(batches)
    return {
        "losses": mean.tolist(),
        "params": pipe.full_parameters(),
        "grid": layout.mine,
        "stage": layout.pp_rank,
        "tp_rank": layout.tp_rank,
        "dp_rank": layout.dp_rank,
        "numel": sum(p.numel() for p in pipe.module.parameters()),
        "trainable": sum(p.numel() for p in opt.params),
        "memory": memory.total,
        "sent": sent,
        "tags": sorted({r.tag for r in ledger.records}),
    }
