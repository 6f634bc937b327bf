"""The rank functions lesson 09's notebook, tests and tour share.

The model is lesson 01's GPT with 4 layers (`build("gpt", layers=4)`: hidden 32, 2 heads,
vocabulary 30, a tied embedding and a frozen `ln_f.bias`), so that p = 2 and 4 stages hold
whole blocks. Its global batches (8 sequences of 16 tokens) are the same everywhere; SGD with
momentum is the optimizer.

- `reference`: the GPT trained in one process.
- `pipeline_on_rank`: `PipelineParallel` on a `ParallelLayout(tp=1, pp=p)` of the world
  (dp = world / p replicas, each on its slice of the batch): losses, the gathered
  parameters, peak activations, the ledger's training bytes, the tied embedding's copy (first
  and last stages) and, for the last step, the (op, microbatch, start, end) timings of every
  step.
"""

from __future__ import annotations

import minidist

from ..data import shard_batch
from ..data_parallel.fixture import STEPS, Fixture, build  # noqa: F401 (STEPS: re-exported)
from ..megatron.layout import ParallelLayout
from ..training import TrainTrace, make_optimizer, train
from .engine import PipelineParallel

PP_GPT = dict(layers=4)
# float32; only the order of summing micro-batch gradients differs from one process
LOSS_TOL, PARAM_TOL = 1e-5, 1e-6
# not training traffic: the comparison contract's gathers and the loss's broadcast
CHECK_TAGS = ("full-state", "pp-loss")


def build_pp(**sizes) -> Fixture:
    """Lesson 01's GPT with 4 layers, its global batches and loss (`sizes` override)."""
    return build("gpt", **{**PP_GPT, **sizes})


def reference(**sizes) -> TrainTrace:
    model, batches, loss_fn = build_pp(**sizes)
    return train(model, batches, loss_fn, make_optimizer(model.parameters()))


def pipeline_on_rank(kind: str, microbatches: int, pp: int, **sizes) -> dict:
    """Train STEPS steps with `kind` on m = `microbatches`, p = `pp` stages."""
    model, batches, loss_fn = build_pp(**sizes)
    layout = ParallelLayout(tp=1, pp=pp)
    pipe = PipelineParallel(model, loss_fn, layout, kind, microbatches)
    opt = make_optimizer(pipe.module.parameters())
    losses = []
    with minidist.comm.record() as ledger:
        for step, batch in enumerate(batches):
            if step == len(batches) - 1:
                pipe.timings = []  # the last step's timeline
            opt.zero_grad()
            losses.append(pipe.train_step(shard_batch(batch, layout.dp_rank, layout.dp_size)))
            opt.step()
    stage = pipe.module
    tied = stage.embedding if stage.first else stage.head  # a copy of the tied embedding, or None
    training = [r for r in ledger.records if r.tag not in CHECK_TAGS]
    by_tag: dict[str, float] = {}
    for r in training:
        by_tag[r.tag] = by_tag.get(r.tag, 0.0) + r.ring_bytes
    by_tag = {tag: sent / len(batches) for tag, sent in by_tag.items()}
    return dict(
        losses=losses,
        params=pipe.full_parameters(),
        stage=layout.pp_rank,
        peak=pipe.peak_alive,
        peak_bytes=pipe.peak_saved_bytes,
        per_mb=pipe.saved_per_microbatch,
        sent_per_step=sum(by_tag.values()),
        sent_by_tag=by_tag,
        timings=pipe.timings,
        dp_per_step=sum(1 for r in training if r.tag == "dp-grads") / len(batches),
        trainable=sum(1 for p in pipe.module.parameters() if p.requires_grad),
        tied=None if tied is None else tied.weight.detach().clone(),
        blocks=[str(k) for k in stage.held],
        first=stage.first,
        last=stage.last,
    )
