"""Ranks seeded differently (torchrun, or spawn without a seed) still hold one model after
any wrapper is built: each broadcasts the group's rank 0 model as DDP does; a constructor
argument that differs between ranks is refused, naming it, on every rank (issue 27)."""

import pytest
import torch
import torch.distributed as dist
from worlds import HUNG_S

import minidist
from minidist.context_parallel import ContextParallelGPT
from minidist.data_parallel.bucketed import BucketedDataParallel
from minidist.data_parallel.naive import NaiveDataParallel
from minidist.expert_parallel.gpt import ExpertParallelGPT, moe_gpt
from minidist.expert_parallel.moe import MoE
from minidist.expert_parallel.parallel import ExpertParallelMoE
from minidist.fsdp.fully_sharded import FullyShardedDataParallel
from minidist.megatron.layout import ParallelLayout
from minidist.megatron.model import TensorParallelGPT
from minidist.models import GPT, MLP, GPTConfig, MLPConfig, lm_loss
from minidist.pipeline.engine import PipelineParallel
from minidist.three_d.stage import split_tensor_parallel_gpt
from minidist.zero.sharded import ZeroDataParallel

CFG = dict(vocab_size=16, seq_len=8, layers=2, heads=2, hidden=8)


def _gpt() -> GPT:
    return GPT(GPTConfig(**CFG))


def _same_everywhere(params: dict[str, torch.Tensor]) -> list[str]:
    """Names of the parameters (whole, local copies) that differ between ranks."""
    differ = []
    for name, t in params.items():
        t = t.detach().float().contiguous()
        every = [torch.empty_like(t) for _ in range(dist.get_world_size())]
        dist.all_gather(every, t)
        if any(not torch.equal(every[0], o) for o in every[1:]):
            differ.append(name)
    return differ


WRAPPERS = {
    "NaiveDataParallel": lambda: NaiveDataParallel(MLP(MLPConfig())),
    "BucketedDataParallel": lambda: BucketedDataParallel(MLP(MLPConfig())),
    "ZeroDataParallel": lambda: ZeroDataParallel(MLP(MLPConfig())),
    "FullyShardedDataParallel": lambda: FullyShardedDataParallel(MLP(MLPConfig())),
    "TensorParallelGPT": lambda: TensorParallelGPT(_gpt()),
    "TensorParallelGPT(sequence_parallel=True)": lambda: TensorParallelGPT(
        _gpt(), sequence_parallel=True
    ),
    "ContextParallelGPT": lambda: ContextParallelGPT(_gpt()),
    "PipelineParallel": lambda: PipelineParallel(_gpt(), lm_loss, ParallelLayout(tp=1, pp=2)),
    "ExpertParallelMoE": lambda: ExpertParallelMoE(MoE(8, 16, 4, seed=dist.get_rank())),
    "ExpertParallelGPT": lambda: ExpertParallelGPT(
        moe_gpt(GPTConfig(**CFG), 4, seed=dist.get_rank())
    ),
    "split_tensor_parallel_gpt": lambda: split_tensor_parallel_gpt(_gpt(), ParallelLayout(tp=2)),
}


def _replicas_on_rank() -> dict[str, list[str]]:
    """{wrapper: its parameters that differ between ranks}, every rank seeded differently."""
    out = {}
    for name, make in WRAPPERS.items():
        torch.manual_seed(1000 + dist.get_rank())
        wrapper = make()
        if name == "PipelineParallel":  # stages differ by design: see the test below
            params = {}
        elif hasattr(wrapper, "full_parameters"):
            params = wrapper.full_parameters()
        else:  # expert parallel, a 3D stage: the replicated parameters
            params = {
                n: p
                for n, p in wrapper.named_parameters()
                if ".experts." not in n
                and not n.startswith("experts.")
                and not hasattr(p, "tp_split")
            }
        out[name] = _same_everywhere(params)
    return out


def test_every_wrapper_gives_ranks_seeded_differently_one_model():
    differ = minidist.launch(_replicas_on_rank, 2, timeout_s=300, idle_s=HUNG_S)[0]
    assert differ == {name: [] for name in WRAPPERS}


def _pipeline_stages_cut_from_rank_0() -> float:
    """The pipeline's stages, gathered, against rank 0's dense model."""
    torch.manual_seed(1000 + dist.get_rank())
    dense = _gpt()
    want = {n: p.detach().clone() for n, p in dense.named_parameters()}
    every = [None, None]
    dist.all_gather_object(every, want)
    pipe = PipelineParallel(dense, lm_loss, ParallelLayout(tp=1, pp=2))
    got = pipe.full_parameters()
    return max((got[n] - every[0][n]).abs().max().item() for n in got)


def test_pipeline_stages_are_cut_from_rank_0s_model():
    assert minidist.launch(_pipeline_stages_cut_from_rank_0, 2, timeout_s=120) == [0.0, 0.0]


ARGS = {
    "k": lambda r: ExpertParallelMoE(MoE(8, 16, 4, k=1 + r)),
    "capacity_factor": lambda r: ExpertParallelMoE(MoE(8, 16, 4, capacity_factor=1.0 + r)),
    "pad_to_capacity": lambda r: ExpertParallelMoE(MoE(8, 16, 4), pad_to_capacity=r == 1),
    "sequence_parallel": lambda r: TensorParallelGPT(_gpt(), sequence_parallel=r == 1),
    "layout": lambda r: ContextParallelGPT(_gpt(), layout=["zigzag", "contiguous"][r]),
    "microbatches": lambda r: PipelineParallel(
        _gpt(), lm_loss, ParallelLayout(tp=1, pp=2), microbatches=2 + 2 * r
    ),
}


def _differing_argument(name: str) -> str:
    try:
        ARGS[name](dist.get_rank())
    except ValueError as exc:
        return str(exc)
    return "accepted"


@pytest.mark.parametrize("name", list(ARGS))
def test_an_argument_that_differs_between_ranks_is_refused_by_name_on_every_rank(name):
    for text in minidist.launch(_differing_argument, 2, name, timeout_s=120):
        assert f"argument {name}=" in text and "differs between ranks" in text, text
