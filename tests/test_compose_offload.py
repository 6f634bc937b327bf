"""Lesson 17's optimizer offloaded to the host (`parallelize(optimizer_cpu_offload=True)`,
`train --optimizer-cpu-offload`: lesson 05's ZeRO-Offload on every dp_shard mode) equals one
process and its plan. Tolerances as tests/test_compose_fsdp.py's (float32: losses 1e-5,
parameters 1e-3, moments 1e-5; bf16 against the float32 model 1e-2, 6e-2, 1e-2): the step
runs the same float32 arithmetic on a host copy, so only the reduction order differs.

The plan is exact: the device holds no master chunk and no Adam state (`host_*` hold them),
and the bytes over the bus per step are each reduced gradient chunk down and each chunk up
for its all-gather (`theory.offload_bytes`). A step that read a stale host chunk, or a copy
skipped or made twice, moves a parameter or a count by far more than the tolerances."""

import pytest
from micro_batches import lean_microbatches, lean_runs
from test_compose import LOSS_TOL, OPTIM_TOL, PARAM_TOL, ref
from test_compose_optim import CFG, STEPS
from worlds import HUNG_S

import minidist
from minidist.compose import theory
from minidist.compose.dims import ParallelDims
from minidist.compose.fixture import build, reference, run_rank
from minidist.training import max_abs_diff

OFF = dict(optimizer_cpu_offload=True)
FSDP = dict(dp_shard_mode="optim_grads_params", **OFF)
ZERO2 = dict(dp_shard_mode="optim_grads", **OFF)
ZERO1 = dict(dp_shard_mode="optim", **OFF)
BF16_TOLS = (1e-2, 6e-2, 1e-2)

LAYOUTS_8 = [
    ("gpt", dict(dp_shard=2, tp=2, pp=2), ZERO1),  # the tied embedding over the stages
    ("moe", dict(dp_shard=4, ep=2, pp=2), FSDP),  # experts' units over ep_shard
    ("gpt", dict(dp_replicate=2, dp_shard=2, tp=2), FSDP),  # HSDP: chunks up and down
    ("llama", dict(dp_shard=2, cp=2, pp=2, schedule="zb-v"), ZERO2),
    ("gpt", dict(dp_shard=2, tp=2, cp=2), {**FSDP, "precision": "bf16"}),  # cast, then up
    ("llama", dict(dp_shard=2, tp=2, pp=2), {**FSDP, "reshard_after_forward": False}),
]


def _planned(name, dims, kw):
    """Rank 0's plan (pipeline rank 0)."""
    model, _ = build(name)
    d, precision, mode = ParallelDims(**dims), kw.get("precision", "fp32"), kw["dp_shard_mode"]
    m = lean_microbatches(dims)
    raf = kw.get("reshard_after_forward", True)
    return {
        "memory": theory.model_state_bytes(model, d, precision, 0, mode, offload=True),
        "bus": theory.offload_bytes(model, d, precision, 0, mode, m, raf),
        "dp": theory.dp_bytes(model, d, precision, 0, mode, m, raf),
    }


def test_offloaded_layouts_of_8_ranks_equal_one_process_and_their_plan():
    results = minidist.launch(lean_runs, 8, LAYOUTS_8, timeout_s=900, idle_s=HUNG_S)
    for i, (name, dims, kw) in enumerate(LAYOUTS_8):
        got, want = results[0][i], ref(name)
        loss_tol, param_tol, optim_tol = (
            BF16_TOLS if "precision" in kw else (LOSS_TOL, PARAM_TOL, OPTIM_TOL)
        )
        assert got["losses"] == pytest.approx(want["losses"], abs=loss_tol), (name, dims, kw)
        assert max_abs_diff(got["params"], want["params"]) < param_tol, (name, dims, kw)
        assert max_abs_diff(got["optim"], want["optim"]) < optim_tol, (name, dims, kw)
        plan = _planned(name, dims, kw)
        measured = {k: v for k, v in got["memory"].items() if k != "activations"}
        assert measured == plan["memory"], (name, dims, kw)
        assert measured["master"] == measured["optimizer"] == 0 < measured["host_optimizer"]
        bus = {k: got["bytes"][k] for k in ("device_to_host", "host_to_device")}
        assert bus == plan["bus"], (name, dims, kw)
        assert got["bytes"]["dp"] == plan["dp"], (name, dims, kw)  # the network's: unchanged


def test_offload_moves_the_device_states_to_the_host_and_nothing_else():
    """The plan of each mode: what leaves the device is exactly master + Adam (and the
    reduced chunks), what the host gains; parameters and the network's bytes unchanged."""
    model, _ = build("moe")
    for mode in ("optim", "optim_grads", "optim_grads_params"):
        for dims in (ParallelDims(dp_shard=4, ep=2, pp=2), ParallelDims(dp_shard=3, tp=2)):
            on = theory.model_state_bytes(model, dims, "fp32", 0, mode, offload=True)
            off = theory.model_state_bytes(model, dims, "fp32", 0, mode)
            assert on["params"] == off["params"]
            assert on["host_master"] == off["master"] and on["host_optimizer"] == off["optimizer"]
            assert on["grads"] + on["host_grads"] == off["grads"] + (
                off["master"] if mode == "optim" else 0
            )


def _optim_runs():
    return [
        run_rank("llama", dict(dp_shard=2, tp=2, sp=True), STEPS, 8, optim=CFG, **FSDP),
        run_rank("gpt", dict(dp_replicate=2, dp_shard=2), STEPS, 8, optim=CFG, **ZERO1),
    ]


def test_clipped_adamw_with_a_schedule_offloaded_equals_torchs():
    """The clipping norm sums squares of host chunks on the device (tolerances as
    tests/test_compose_optim.py's; the norm within 1e-5 relative)."""
    runs = minidist.launch(_optim_runs, 4, timeout_s=600, idle_s=HUNG_S)[0]
    for model, got in zip(("llama", "gpt"), runs):
        want = reference(model, STEPS, 8, optim=CFG)
        assert got["losses"] == pytest.approx(want["losses"], abs=LOSS_TOL), model
        assert got["norms"] == pytest.approx(want["norms"], rel=1e-5), model
        assert max_abs_diff(got["params"], want["params"]) < PARAM_TOL, model
