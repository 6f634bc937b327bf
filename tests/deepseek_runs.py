"""DeepSeek-V3's bias update (lesson 19) in one process and composed (lesson 17)."""

from __future__ import annotations

import re

import hf_models
import hf_runs
import torch
from hf_runs import BATCH, LR, SEQ, STEPS, shifted

from minidist.compose.dims import Grid, ParallelDims
from minidist.compose.fixture import data_rows, one_step
from minidist.compose.parallelize import parallelize
from minidist.deepseek.moe import BIAS, count_expert_load, load_group, routers, update_routing_bias

ROUTING = {"n_routed_experts": 8, "n_group": 4, "topk_group": 2}  # 2 groups of 4 chosen


def biases(model) -> dict[int, torch.Tensor]:
    """{layer index: its router's bias}."""
    layer = lambda name: int(re.search(r"layers\.(\d+)\.", name).group(1))  # noqa: E731
    return {layer(n): getattr(r, BIAS).detach().float().clone() for n, r in routers(model)}


def reference(speed: float, steps: int = STEPS) -> dict:
    """The untouched model, Adam at LR, the bias updated after each step."""
    out = hf_runs.reference(
        "deepseek_v3",
        steps,
        prepare=count_expert_load,
        after_step=lambda model: update_routing_bias(model, speed),
        **ROUTING,
    )
    return {
        "losses": out["losses"],
        "params": out["params"],
        "biases": biases(out["model"]),
        "loads": out["after"],
    }


def composed(dims: dict, speed: float, steps: int = STEPS) -> dict:
    """On every rank: the same run composed under `dims`; this rank's layers' biases."""
    pdims = ParallelDims(**dims)
    grid = Grid(pdims)
    model = hf_models.build("deepseek_v3", **ROUTING)
    m = BATCH // (pdims.dp_replicate * pdims.dp_shard)
    engine = parallelize(model, pdims, grid=grid, microbatches=m, seq_len=SEQ, lr=LR)
    count_expert_load(engine)
    rows = list(data_rows(grid, BATCH))
    losses = []
    for ids, labels in hf_models.batches(steps, BATCH, SEQ):
        losses.append(one_step(engine, grid, ids[rows], shifted(labels)[rows])[0])
        update_routing_bias(engine, speed, load_group(engine))
    return {"losses": losses, "params": engine.full_parameters(), "biases": biases(engine)}


def several(runs):
    return [composed(dims, speed) for dims, speed in runs]


def deepseek_factory():
    """A `--model deepseek_runs:deepseek_factory` for the trainer: a dense layer, then an
    MoE layer of 8 experts in 4 groups."""
    return hf_models.build("deepseek_v3", layers=2, **ROUTING)


def trained(argvs: list[list[str]]) -> list[dict]:
    """On every rank: the trainer's runs of `argvs`, one after the other."""
    from minidist.trainer.cli import dims_of, parse
    from minidist.trainer.loop import train_rank

    return [train_rank(parse(a), dims_of(parse(a))) for a in argvs]


def saved_tensor(path: str, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """On a world of 1: the whole tensor `name` of the checkpoint at `path`."""
    from minidist.pieces import Piece
    from minidist.resilience.universal import load

    out = torch.zeros(shape)
    load(path, [Piece(name, shape, (0,) * len(shape), shape, None, out)], strict=False)
    return out
