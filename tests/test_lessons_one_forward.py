"""Lessons 07, 09 and 10 run the course GPT's own forward: their classes are copies of the
model edited in place (lesson 07's tensor-parallel plan, lesson 09's `Stage`), no forward
of the model written a second time.

Forward hooks counting calls, registered on the dense GPT before the lesson's class is built
(the copies keep them), show that a step calls the GPT's forward once per micro-batch and
stage, and each of its attentions and MLPs once per micro-batch and block held, as the
model's own classes: a stage or a tensor-parallel model that re-walked the GPT's blocks, or
an attention written again, would not call them (or call them as another class).
"""

import torch.distributed as dist

import minidist
from minidist.data_parallel.fixture import build
from minidist.megatron import ParallelLayout
from minidist.models import GPT, Block, CausalSelfAttention


def hooked_gpt(**sizes):
    """The dense GPT, its data and loss, and the counts its hooks fill."""
    model, batches, loss_fn = build("gpt", **sizes)
    calls = {"model": 0, "attention": 0, "mlp": 0}

    def counter(kind):
        def hook(module, args, output):
            calls[kind] += 1

        return hook

    model.register_forward_hook(counter("model"))
    for block in model.blocks:
        block.attn.register_forward_hook(counter("attention"))
        block.mlp.register_forward_hook(counter("mlp"))
    return model, batches, loss_fn, calls


def own_classes(module) -> dict:
    return {
        "model": [type(m) for n, m in module.named_modules() if n.rpartition(".")[2] == "model"],
        "attention": [type(m) for n, m in module.named_modules() if n.endswith(".attn")],
    }


def pipeline_calls(kind: str, m: int, virtual: int) -> dict:
    from minidist.pipeline import PipelineParallel

    model, batches, loss_fn, calls = hooked_gpt(layers=4)
    p = dist.get_world_size()
    pipe = PipelineParallel(model, loss_fn, ParallelLayout(tp=1, pp=p), kind, m, virtual)
    pipe.train_step(batches[0])
    held = sum(isinstance(m, Block) for m in pipe.modules())  # the blocks its chunks hold
    return {**calls, "chunks": len(pipe.chunks), "held": held, "types": own_classes(pipe)}


def test_lesson_09s_stages_run_the_gpts_own_forward():
    for kind, virtual in (("1f1b", 1), ("interleaved", 2), ("zb-v", 1)):
        for got in minidist.launch(pipeline_calls, 2, kind, 2, virtual):
            assert got["model"] == 2 * got["chunks"], (kind, got)
            assert got["attention"] == got["mlp"] == 2 * got["held"], (kind, got)
            assert got["types"]["model"] == [GPT] * got["chunks"], (kind, got)
            assert got["types"]["attention"] == [CausalSelfAttention] * got["held"], (kind, got)


def tensor_parallel_calls(sequence_parallel: bool) -> dict:
    from minidist.megatron import TensorParallelGPT

    model, batches, _, calls = hooked_gpt(heads=2)
    tp = TensorParallelGPT(model, None, sequence_parallel=sequence_parallel)
    x, y = batches[0]
    tp.loss(tp(x), y).backward()
    return {**calls, "held": model.cfg.layers, "types": own_classes(tp)}


def test_lesson_07s_tensor_parallel_gpt_runs_the_gpts_own_forward():
    for sequence_parallel in (False, True):
        for got in minidist.launch(tensor_parallel_calls, 2, sequence_parallel):
            assert got["model"] == 1, got
            assert got["attention"] == got["mlp"] == got["held"], got
            assert got["types"]["attention"] == [CausalSelfAttention] * got["held"], got


def three_d_calls(m: int) -> dict:
    from minidist.three_d import ThreeDParallel

    model, batches, _, calls = hooked_gpt(layers=4, heads=2)
    layout = ParallelLayout(tp=2, pp=2)
    pipe = ThreeDParallel(model, layout, "1f1b", m)
    pipe.train_step(batches[0])
    held = model.cfg.layers // layout.pp_size
    return {**calls, "held": held, "types": own_classes(pipe)}


def test_lesson_10s_tensor_parallel_stage_runs_the_gpts_own_forward():
    for got in minidist.launch(three_d_calls, 4, 2):
        assert got["model"] == 2, got
        assert got["attention"] == got["mlp"] == 2 * got["held"], got
        assert got["types"]["model"] == [GPT], got
        assert got["types"]["attention"] == [CausalSelfAttention] * got["held"], got
