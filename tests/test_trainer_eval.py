"""The trainer's evaluation is forward only (issue 35): on every layout the held-out loss is
one process's loss of the same weights under `torch.no_grad()` (the built-ins' `lm_loss`
of their logits; a transformers model's own `model(x, labels=labels).loss`), and an
evaluation leaves the parameters, the gradients and the optimizer state as they were, bit
for bit, with no backward collective in its ledger.

Each layout trains one step (so gradients and Adam's moments exist), evaluates the next
batch, and returns what it held before and after (whole tensors, and each rank's own
`.grad`s). Tolerance on the loss: 1e-5 (float32, a different reduction order; lesson
17's); measured ≤ 3.6e-7 (0 on transformers' Mistral at pp 2 · tp 2). The ledger of an
evaluation holds no tag of a backward or a gradient reduction ("...-backward", "... grad",
"...-grads", "zero1-..."), and the pipeline's point-to-point messages are exactly half a
training step's (the activations, not their gradients).
"""

import pytest
import torch
from micro_batches import lean_microbatches
from worlds import HUNG_S

import minidist
from minidist import comm
from minidist.compose.dims import Grid, ParallelDims
from minidist.compose.fixture import MODELS, build, data_rows, eval_step, one_step
from minidist.compose.parallelize import parallelize
from minidist.models import lm_loss

LAYOUTS = [  # 4 ranks each
    ("llama", dict(dp_shard=2, tp=2, sp=True)),
    ("gpt", dict(dp_shard=2, pp=2)),  # the tied embedding on two stages
    ("llama", dict(cp=2, tp=2)),
    ("moe", dict(dp_shard=4, ep=2)),
    ("llama", dict(dp_shard=2, pp=2, schedule="interleaved", virtual=2)),
    ("gpt", dict(dp_replicate=2, pp=2, schedule="zb-v")),  # a V: rank 0 ends the pipeline
    ("mistral", dict(pp=2, tp=2, sp=True)),  # transformers' (labels -100 ignored)
    ("mistral", dict(dp_shard=2, cp=2)),
]
BACKWARD_TAGS = ("backward", "grad", "zero1")


def _state(engine) -> dict:
    """Whole tensors (the reduced gradients) and this rank's own `.grad`s."""
    mine = {n: p.grad.clone() for n, p in engine.module.named_parameters() if p.grad is not None}
    return {
        "params": engine.full_parameters(),
        "grads": engine.full_grads(),
        "optim": engine.full_optimizer_state(),
        "rank_grads": mine,
    }


def _pp(ledger) -> int:
    return sum(r.tag == "pp" for r in ledger.records)


def _model(name: str) -> tuple[torch.nn.Module, list]:
    """The model and two global batches (ids, next-token targets) of `name`: a built-in of
    `compose.fixture.build`, or a transformers model with labels shifted as it shifts them."""
    if name in MODELS:
        model, batches = build(name, steps=2, global_batch=8)
        return model, list(batches)
    hf_models = pytest.importorskip("hf_models")
    ignored = torch.full((8, 1), -100)
    return hf_models.build(name), [
        (x, torch.cat([y[:, 1:], ignored], 1)) for x, y in hf_models.batches(2, 8, 16)
    ]


def _evaluate_layouts() -> list[dict]:
    out = []
    for name, dims in LAYOUTS:
        pdims = ParallelDims(**dims)
        model, batches = _model(name)
        grid = Grid(pdims)
        m = lean_microbatches(dims)
        engine = parallelize(model, pdims, grid=grid, microbatches=m, seq_len=16)
        rows = data_rows(grid, 8)
        (x0, y0), (x1, y1) = (
            (x[rows.start : rows.stop], y[rows.start : rows.stop]) for x, y in batches
        )
        _, _, trained, _ = one_step(engine, grid, x0, y0)
        before = _state(engine)
        with comm.record() as ledger:
            loss = eval_step(engine, grid, x1, y1)
        after = _state(engine)
        untouched = {
            kind: before[kind].keys() == after[kind].keys()
            and all(torch.equal(t, after[kind][n]) for n, t in before[kind].items())
            for kind in before
        }
        out.append(
            {
                "loss": loss,
                "params": before["params"],
                "training": engine.training,
                "untouched": untouched,
                "counts": {k: len(before[k]) for k in before},
                "tags": sorted({r.tag for r in ledger.records}),
                "pp_messages": (_pp(ledger), _pp(trained)),
            }
        )
    return out


def test_evaluation_is_forward_only_and_equals_one_process_on_every_layout():
    runs = minidist.launch(_evaluate_layouts, 4, timeout_s=600, idle_s=HUNG_S)
    for (name, dims), got in zip(LAYOUTS, runs[0]):
        model, batches = _model(name)
        missing, unexpected = model.load_state_dict(got["params"], strict=False)
        assert set(missing) <= {"lm_head.weight"} and not unexpected, dims  # GPT's tied head
        model.eval()
        with torch.no_grad():
            if name in MODELS:
                want = lm_loss(model(batches[1][0]), batches[1][1]).item()
            else:
                x, labels = pytest.importorskip("hf_models").batches(2, 8, 16)[1]
                want = model(x, labels=labels).loss.item()
        assert got["loss"] == pytest.approx(want, abs=1e-5), dims
        assert got["training"], dims  # back in training mode
        assert got["counts"]["grads"] and got["counts"]["optim"], dims
    for (_, dims), ranks in zip(LAYOUTS, zip(*runs)):
        for got in ranks:
            assert all(got["untouched"].values()) and got["counts"]["rank_grads"], dims
            assert not [t for t in got["tags"] if any(w in t for w in BACKWARD_TAGS)], dims
            evaluated, trained = got["pp_messages"]
            assert 2 * evaluated == trained and (trained > 0) == ("pp" in dims), dims
