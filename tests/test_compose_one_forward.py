"""Lesson 17 runs each model's own forward, once: no forward of a model written twice.

`parallelize` edits a copy of the model in place (the pipeline split, tensor and sequence
parallelism, ring attention as the attention's kernel, the experts over ep, recompute); the
modules it keeps are the model's own, of the model's own classes. Forward hooks counting
calls, registered on the model before `parallelize` (the copies keep them), show that one
step calls the model's forward once per micro-batch and chunk, and each attention and MLP
once per micro-batch and layer held (twice under recomputation): a chunk that re-walked the
model's forward, or an attention written again, would not call them (or call them as
another class). Layouts with pp (1F1B, interleaved, ZB-V), tp with sp, cp, ep, and
recompute; and lesson 15's `ContextParallelGPT`, which swaps the same kernel call.
"""

from worlds import HUNG_S

import minidist
from minidist.compose.dims import Grid, ParallelDims
from minidist.compose.fixture import build, data_rows, one_step
from minidist.compose.parallelize import parallelize
from minidist.models import GPT, Block, CausalSelfAttention
from minidist.models_llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM

LAYOUTS = [  # (model, dims, recompute), on 2 ranks
    ("gpt", dict(pp=2), False),
    ("gpt", dict(pp=2, schedule="interleaved", virtual=2), True),
    ("llama", dict(tp=2, sp=True), False),
    ("llama", dict(pp=2, schedule="zb-v"), False),
    ("gpt", dict(cp=2), False),
    ("llama", dict(cp=2), True),
    ("moe", dict(dp_shard=2, ep=2), False),
    ("gpt", dict(tp=2, sp=True), True),
]
OWN = {  # the model's class, its attention's and its layer's
    "gpt": (GPT, CausalSelfAttention, Block),
    "moe": (GPT, CausalSelfAttention, Block),
    "llama": (LlamaForCausalLM, LlamaAttention, LlamaDecoderLayer),
}


def count_calls(layouts) -> list[dict]:
    out = []
    for name, dims, recompute in layouts:
        model, batches = build(name, steps=1)
        calls = {"model": 0, "attention": 0, "mlp": 0}

        def counter(kind, calls=calls):
            def hook(module, args, output):
                calls[kind] += 1

            return hook

        model.register_forward_hook(counter("model"))
        _, attention, layer = OWN[name]
        for module in model.modules():
            if isinstance(module, attention):
                module.register_forward_hook(counter("attention"))
            if isinstance(module, layer):
                module.mlp.register_forward_hook(counter("mlp"))
        pdims = ParallelDims(**dims)
        grid = Grid(pdims)
        rows = data_rows(grid, 8)
        engine = parallelize(model, pdims, grid=grid, microbatches=2, recompute=recompute)
        x, y = batches[0]
        one_step(engine, grid, x[rows.start : rows.stop], y[rows.start : rows.stop])
        kinds = {
            "model": [type(c.model) for c in engine.chunks],
            "attention": [
                type(m)
                for c in engine.chunks
                for n, m in c.named_modules()
                if n.rpartition(".")[2] in ("attn", "self_attn")
            ],
        }
        held = sum(len(c.layers()) for c in engine.chunks)
        out.append({**calls, "chunks": len(engine.chunks), "held": held, "types": kinds})
    return out


def test_the_course_models_own_forward_runs_once_per_micro_batch_on_every_layout():
    ranks = minidist.launch(count_calls, 2, LAYOUTS, timeout_s=600, idle_s=HUNG_S)
    for rank in ranks:
        for (name, dims, recompute), got in zip(LAYOUTS, rank):
            model_cls, attention_cls, _ = OWN[name]
            m = 2  # micro-batches
            times = 2 if recompute else 1  # a recomputed layer's forward runs again in backward
            assert got["model"] == m * got["chunks"], (name, dims, got)
            assert got["attention"] == times * m * got["held"], (name, dims, got)
            assert got["mlp"] == times * m * got["held"], (name, dims, got)
            assert got["types"]["model"] == [model_cls] * got["chunks"], (name, dims)
            assert got["types"]["attention"] == [attention_cls] * got["held"], (name, dims)


def count_context_parallel_calls(layout: str) -> dict:
    """Lesson 15's `ContextParallelGPT`, a thin use of the same kernel swap: the GPT's own
    forward and attentions run, once per step and layer."""
    from minidist.context_parallel import ContextParallelGPT

    model, batches = build("gpt", steps=1)
    calls = {"model": 0, "attention": 0}
    model.register_forward_hook(lambda m, a, o: calls.__setitem__("model", calls["model"] + 1))
    for block in model.blocks:
        block.attn.register_forward_hook(
            lambda m, a, o: calls.__setitem__("attention", calls["attention"] + 1)
        )
    cp = ContextParallelGPT(model, None, layout)
    x, y = batches[0]
    cp.loss(cp(x), y).backward()
    types = [type(b.attn) for b in cp.module.blocks]
    return {**calls, "types": types, "layers": len(cp.module.blocks)}


def test_lesson_15s_context_parallel_gpt_runs_the_gpts_own_forward():
    for layout in ("zigzag", "contiguous"):
        for got in minidist.launch(count_context_parallel_calls, 2, layout):
            assert got["model"] == 1 and got["attention"] == got["layers"], got
            assert got["types"] == [CausalSelfAttention] * got["layers"], got
