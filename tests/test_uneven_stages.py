"""Uneven pipeline stages (issue 34): any number of layers ≥ the stages, as torch's
pipelining allows. `three_d.theory.stage_layers` deals the layers out as evenly as possible
(lesson 10's rule, and lesson 09's for the GPT's stages); the course models and the
transformers models train equal to one process on such splits, and what lesson 17's theory
plans for them (memory and bytes per rank) equals what the run measured, to the byte.
Tolerances: tests/test_trainer.py's (losses 1e-5, parameters 1e-3)."""

import hf_models
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_compose_hf import run_and_check
from test_trainer import _close_to_one_process, _runs
from worlds import HUNG_S

import minidist
from minidist.compose.dims import ParallelDims
from minidist.three_d.theory import stage_layers
from minidist.trainer.cli import _planned, parse


@given(st.integers(1, 40), st.integers(1, 40))
def test_stage_layers_cover_every_layer_once_in_order_as_evenly_as_possible(layers, stages):
    if layers < stages:
        with pytest.raises(ValueError, match="need at least one layer each"):
            ParallelDims(pp=stages).check_model(4 * stages, layers, 2 * stages)
        return
    runs = stage_layers(layers, stages)
    assert [i for r in runs for i in r] == list(range(layers))
    lengths = [len(r) for r in runs]
    assert min(lengths) >= 1 and max(lengths) - min(lengths) <= 1
    assert [r.start for r in runs] == [round(k * layers / stages) for k in range(stages)]


COURSE = [
    ["--model", "llama", "--pp", "2", "--layers", "5", "--tp", "2", "--sp"],
    ["--model", "gpt", "--pp", "4", "--layers", "5"],
    ["--model", "llama", "--pp", "2", "--schedule", "zb-v", "--layers", "7", "--dp-shard", "2"],
    ["--model", "moe", "--pp", "2", "--layers", "3", "--ep", "2", "--dp-shard", "2"],
]


def test_the_course_models_on_uneven_stages_equal_one_process_and_their_plan():
    argvs = [[*a, "--steps", "2"] for a in COURSE]
    results = minidist.launch(_runs, 4, argvs, timeout_s=900, idle_s=HUNG_S)
    for i, argv in enumerate(argvs):
        _close_to_one_process(results[0][i], argv)
        args = parse(argv)
        from minidist.trainer.loop import prepare

        plan = _planned(args, prepare(args)[1])
        for what in ("bytes", "memory"):
            for kind, planned in plan[what].items():
                measured = max(r[i][what].get(kind, 0) for r in results)
                assert measured == planned, (argv, what, kind)


def test_transformers_models_on_uneven_stages_equal_one_process():
    pytest.importorskip("transformers")
    assert hf_models  # tiny configs, random weights (tests/hf_models.py)
    run_and_check(
        [
            ("llama", dict(pp=2, tp=2), {"layers": 3}),
            ("gpt2", dict(pp=4), {"layers": 5}),
            ("qwen2", dict(pp=2, schedule="zb-v", dp_shard=2), {"layers": 5}),
        ],
        4,
    )
