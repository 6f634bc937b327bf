"""Lesson 17's dp_shard as ZeRO-2 and ZeRO-3 (FSDP) per layer (`compose/fsdp.py`) equals one
process, and its plan: the same tolerances as tests/test_compose.py (float32: losses 1e-5,
parameters 1e-3, Adam's moments 1e-5; the gradient's mean is reduced in other orders) and,
in bf16 against the float32 model, tests/test_compose_layouts.py's (losses 1e-2, parameters
2·steps·lr = 6e-2, moments 1e-2: bf16 keeps 8 bits). A unit reduced twice, or a micro-batch
or a W step's gradients left out, moves the second loss by far more than 1e-5. Measured on
the 8-rank list: losses ≤ 4.8e-7, parameters ≤ 9.4e-5, moments ≤ 2.2e-7; bf16 5.6e-4,
4.8e-2, 6.0e-4."""

import pytest
from micro_batches import lean_micro_batch, lean_microbatches, lean_runs
from test_compose import LOSS_TOL, OPTIM_TOL, PARAM_TOL, ref
from test_compose_optim import CFG, STEPS
from worlds import HUNG_S

import minidist
from minidist.compose import parallelize, theory
from minidist.compose.dims import ParallelDims
from minidist.compose.fixture import build, reference, run_rank
from minidist.ledger import ring_bytes as ring
from minidist.trainer.cli import parse
from minidist.training import max_abs_diff

FSDP = dict(dp_shard_mode="optim_grads_params")
ZERO2 = dict(dp_shard_mode="optim_grads")
BF16_TOLS = (1e-2, 6e-2, 1e-2)

LAYOUTS_8 = [
    ("gpt", dict(tp=2, cp=2, pp=2), FSDP),  # sharded over cp alone
    ("gpt", dict(dp_shard=2, tp=2, sp=True, cp=2), FSDP),
    ("llama", dict(dp_shard=2, cp=2, pp=2, schedule="zb-v"), FSDP),
    ("gpt", dict(dp_shard=2, tp=2, pp=2, schedule="zb-h1"), {**FSDP, "recompute": True}),
    ("moe", dict(dp_shard=4, ep=2, pp=2), FSDP),  # experts over ep_shard (2), dense over 4
    ("gpt", dict(dp_replicate=2, dp_shard=2, tp=2), FSDP),  # HSDP
    ("llama", dict(dp_shard=4, pp=2, schedule="interleaved", virtual=2), ZERO2),
    ("llama", dict(dp_shard=2, tp=2, pp=2), {**FSDP, "reshard_after_forward": False}),
    ("gpt", dict(dp_shard=2, tp=2, cp=2), {**FSDP, "precision": "bf16"}),
]


def test_fsdp_and_zero2_layouts_of_8_ranks_equal_one_process_and_their_plan():
    results = minidist.launch(lean_runs, 8, LAYOUTS_8, timeout_s=900, idle_s=HUNG_S)
    for i, (name, dims, kw) in enumerate(LAYOUTS_8):
        got, want = results[0][i], ref(name)
        loss_tol, param_tol, optim_tol = (
            BF16_TOLS if "precision" in kw else (LOSS_TOL, PARAM_TOL, OPTIM_TOL)
        )
        assert got["losses"] == pytest.approx(want["losses"], abs=loss_tol), (name, dims, kw)
        assert max_abs_diff(got["params"], want["params"]) < param_tol, (name, dims, kw)
        assert max_abs_diff(got["optim"], want["optim"]) < optim_tol, (name, dims, kw)
        for rank in results[1:]:
            assert rank[i]["losses"] == got["losses"]
        plan = _planned(name, dims, kw)  # the MoE's too: here every expert gets tokens
        measured = {k: v for k, v in got["memory"].items() if k != "activations"}
        assert measured == plan["memory"], (name, dims, kw)
        assert got["bytes"]["dp"] == plan["bytes"]["dp"], (name, dims, kw)
        assert got["bytes"].get("tp", 0) == plan["bytes"]["tp"], (name, dims, kw)


def _planned(name, dims, kw):
    """Rank 0's plan (pipeline rank 0), as tests/test_compose_theory.py's; tp's too: a
    layer's partial gradients are summed over tp before each of its reduce-scatters."""
    model, _ = build(name)
    d, precision, mode = ParallelDims(**dims), kw.get("precision", "fp32"), kw["dp_shard_mode"]
    m = lean_microbatches(dims)
    raf = kw.get("reshard_after_forward", True)
    tp = (model, d, lean_micro_batch(dims), m, precision, kw.get("recompute", False), 0, mode)
    return {
        "memory": theory.model_state_bytes(model, d, precision, 0, mode),
        "bytes": {
            "dp": theory.dp_bytes(model, d, precision, 0, mode, m, raf),
            "tp": theory.tp_bytes(*tp),
        },
    }


def partial_sums(mode: str) -> list[int]:
    """The calls summing the partial gradients over tp in one step of 2 micro-batches."""
    from minidist import comm
    from minidist.compose.dims import Grid
    from minidist.compose.fixture import data_rows, one_step

    dims = ParallelDims(dp_shard=2, tp=2, sp=True)
    model, batches = build("gpt", steps=1)
    grid = Grid(dims)
    engine = parallelize(model, dims, grid=grid, microbatches=2, dp_shard_mode=mode)
    x, y = batches[0]
    rows = data_rows(grid, 8)
    with comm.record() as ledger:
        one_step(engine, grid, x[rows.start : rows.stop], y[rows.start : rows.stop])
    return [r.payload_bytes for r in ledger.records if r.tag == "sp-replicated-grad"]


def test_partial_gradients_are_summed_once_per_step_or_per_layer_before_its_reduce():
    """Under sp the norms' and row biases' gradients are partial sums over tp: ZeRO-1 sums
    them all in one all-reduce per step (Megatron-LM's `finalize_model_grads`); ZeRO-2 and
    FSDP reduce-scatter each layer's gradients after each micro-batch, so each layer's are
    summed just before, in one call: 4 layers × 2 micro-batches, then the root's (the final
    norm and the learned positions, reduced at the step's end)."""
    model, _ = build("gpt")
    layer = sum(p.numel() for n, p in model.named_parameters() if n.startswith("blocks.0."))
    per_layer = sum(  # the layer's replicated parameters: norms and biases of the outputs
        p.numel()
        for n, p in model.named_parameters()
        if n.startswith("blocks.0.") and (".ln" in n or n.endswith(("proj.bias", "mlp.2.bias")))
    )
    assert 0 < per_layer < layer
    final = sum(p.numel() for n, p in model.named_parameters() if n.startswith(("ln_f.", "pos_")))
    got = minidist.launch(
        lambda: [partial_sums(m) for m in ("optim", "optim_grads", "optim_grads_params")], 4
    )
    for rank in got:
        once, zero2, fsdp = rank
        assert len(once) == 1 and once[0] == 4 * (4 * per_layer + final), once
        assert zero2 == fsdp == [4 * per_layer] * 8 + [4 * final], zero2


def test_fsdp_sends_two_gathers_and_one_reduce_scatter_per_unit_and_micro_batch():
    """dp_shard 4, no pipeline, 2 micro-batches: every layer gathered in each forward and
    again in each backward, reduced once per micro-batch; the root once per step."""
    model, _ = build("gpt")
    dims = ParallelDims(dp_shard=4)
    want = 0.0
    for _, n, g, layer in theory.units(model, dims):
        padded = -(-n // g) * g
        reduces, gathers = (2, 4) if layer else (1, 1)  # m = 8 / dp_shard = 2
        want += reduces * ring("reduce_scatter", 4 * padded, g)
        want += gathers * ring("all_gather", 4 * padded, g)
    assert theory.dp_bytes(model, dims, mode="optim_grads_params", microbatches=2) == want


def test_a_bad_mode_is_refused_before_any_rank_starts():
    model, _ = build("gpt")
    with pytest.raises(ValueError, match="--dp-shard-mode='zero3' must be one of"):
        parallelize(model, ParallelDims(), dp_shard_mode="zero3")


def test_the_cli_refuses_a_bad_mode_with_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse(["--dp-shard", "2", "--dp-shard-mode", "zero3"])
    assert exit_.value.code == 2
    assert "--dp-shard-mode: invalid choice: 'zero3'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--no-reshard-after-forward needs --dp-shard-mode"):
        parse(["--dp-shard", "2", "--no-reshard-after-forward"])


HF_RUNS_4 = [
    ("llama", dict(dp_shard=2, tp=2, sp=True), FSDP),
    ("mixtral", dict(dp_shard=4, ep=2), FSDP),
    ("qwen2", dict(dp_shard=2, pp=2, schedule="zb-v"), {**FSDP, "recompute": True}),
    ("gpt2", dict(dp_replicate=2, dp_shard=2), FSDP),  # the tied head in the root
    ("mistral", dict(dp_shard=2, cp=2), ZERO2),
    ("llama", dict(dp_shard=2, tp=2), {**FSDP, "precision": "bf16"}),
]


def test_transformers_models_under_fsdp_and_zero2_equal_one_process():
    pytest.importorskip("transformers")
    import hf_runs

    results = minidist.launch(hf_runs.several, 4, HF_RUNS_4, timeout_s=900, idle_s=HUNG_S)
    for i, (name, dims, kw) in enumerate(HF_RUNS_4):
        got, want = results[0][i], hf_runs.reference(name)
        loss_tol, param_tol, optim_tol = (
            BF16_TOLS if "precision" in kw else (LOSS_TOL, PARAM_TOL, OPTIM_TOL)
        )
        assert got["losses"] == pytest.approx(want["losses"], abs=loss_tol), (name, dims, kw)
        assert max_abs_diff(got["params"], want["params"]) < param_tol, (name, dims, kw)
        assert max_abs_diff(got["optim"], want["optim"]) < optim_tol, (name, dims, kw)


OPTIM_LAYOUTS = [  # 4 ranks: clipped AdamW with decay and a schedule (tests/test_compose_optim)
    ("llama", dict(dp_shard=2, tp=2, sp=True), FSDP),
    ("moe", dict(dp_shard=4, ep=2), FSDP),
    ("gpt", dict(dp_replicate=2, dp_shard=2), ZERO2),
]


def _optim_runs():
    return [run_rank(m, dims, STEPS, 8, optim=CFG, **kw) for m, dims, kw in OPTIM_LAYOUTS]


def test_clipped_adamw_with_a_schedule_under_fsdp_and_zero2_equals_torchs():
    """Tolerances as tests/test_compose_optim.py's in float32 (the norm within 1e-5 relative)."""
    runs = minidist.launch(_optim_runs, 4, timeout_s=600, idle_s=HUNG_S)[0]
    for (model, dims, _), got in zip(OPTIM_LAYOUTS, runs):
        want = reference(model, STEPS, 8, optim=CFG)
        assert got["losses"] == pytest.approx(want["losses"], abs=LOSS_TOL), dims
        assert got["norms"] == pytest.approx(want["norms"], rel=1e-5), dims
        assert max_abs_diff(got["params"], want["params"]) < PARAM_TOL, dims
