"""DeepSeekMoE's auxiliary-loss-free balancing: the bias update by hand, its global load under
lesson 17's layouts equal to one process, γ = 0 the untouched model; the sequence-wise
balance loss and the nodes a token's experts span, by hand.

Composed against one process (tests/test_compose_hf.py's tolerances): losses 1e-5
(measured ≤ 7.2e-7), parameters 1e-3 (measured ≤ 8.7e-5); the biases exactly (they move by
±γ from counts of integers: a layout that counts other tokens moves some by 2γ).
"""

from __future__ import annotations

import deepseek_runs
import hf_models
import hf_runs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from worlds import HUNG_S

import minidist
from minidist.deepseek.moe import (
    BIAS,
    bias_step,
    count_expert_load,
    nodes_per_token,
    routers,
    sequence_balance_loss,
    update_routing_bias,
)
from minidist.training import max_abs_diff

pytest.importorskip("transformers")

SPEED = 0.1  # large against sigmoid affinities in (0, 1), so 3 steps change the routing


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bias_step_by_hand(dtype):
    bias = torch.tensor([0.5, 0.0, -0.25, 0.0, 1.0], dtype=dtype)
    load = torch.tensor([3, 1, 2, 2, 2])  # mean 2: one over, one under, three at the mean
    want = torch.tensor([0.5 - 0.1, 0.0 + 0.1, -0.25, 0.0, 1.0], dtype=dtype)
    got = bias_step(bias, load, 0.1)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert got.dtype == dtype and bias[0] == 0.5  # a new tensor
    same = torch.full((5,), 7)
    assert torch.equal(bias_step(bias, same, 0.1), bias)  # balanced: nothing moves


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=9), st.floats(1e-4, 1.0))
def test_bias_step_moves_each_expert_by_speed_against_its_excess(loads, speed):
    load = torch.tensor(loads)
    bias = torch.linspace(-1, 1, len(loads), dtype=torch.float64)
    got = bias_step(bias, load, speed)
    mean = sum(loads) / len(loads)
    for i, n in enumerate(loads):  # overloaded down, underloaded up, at the mean still
        move = -speed if n > mean else speed if n < mean else 0.0
        assert got[i].item() == pytest.approx(bias[i].item() + move, abs=1e-15)


def test_counts_are_the_routed_tokens_of_training_forwards_only():
    model = hf_models.build("deepseek_v3", **deepseek_runs.ROUTING)
    assert count_expert_load(model) == 3  # layers 1-3 (layer 0 is dense)
    seen = {}

    def keep(router, inputs, output):  # the first forward's choices (returns None: no swap)
        seen.setdefault(router, output[-1])

    for _, router in routers(model):
        router.register_forward_hook(keep)
    ids = hf_models.batches(1, 2, 8)[0][0]
    model(input_ids=ids)
    model.eval()
    model(input_ids=ids)  # not counted: evaluation
    model.train()
    loads = update_routing_bias(model, SPEED)
    for name, router in routers(model):
        want = torch.bincount(seen[router].flatten(), minlength=8)
        assert torch.equal(loads[name], want) and loads[name].sum() == 2 * 8 * 2
        assert router.expert_load.sum() == 0  # reset for the next step
        torch.testing.assert_close(getattr(router, BIAS), bias_step(torch.zeros(8), want, SPEED))
    with pytest.raises(ValueError, match="no router"):
        count_expert_load(hf_models.build("llama"))


def test_speed_zero_is_the_untouched_model():
    ours = deepseek_runs.reference(0.0)
    want = hf_runs.reference("deepseek_v3", **deepseek_runs.ROUTING)
    assert ours["losses"] == want["losses"]
    assert max_abs_diff(ours["params"], want["params"]) == 0
    assert all(b.abs().max() == 0 for b in ours["biases"].values())


RUNS_2 = [(dict(dp_shard=2, ep=2), SPEED), (dict(pp=2), SPEED)]
RUNS_4 = [(dict(dp_replicate=2, dp_shard=2, ep=2), SPEED), (dict(pp=2, dp_shard=2, ep=2), SPEED)]


@pytest.mark.parametrize("world,runs", [(2, RUNS_2), (4, RUNS_4)])
def test_global_load_under_composition_equals_one_process(world, runs):
    want = deepseek_runs.reference(SPEED)
    assert any(b.abs().max() > 0 for b in want["biases"].values())
    results = minidist.launch(deepseek_runs.several, world, runs, timeout_s=600, idle_s=HUNG_S)
    for i in range(len(runs)):
        got = results[0][i]
        assert got["losses"] == pytest.approx(want["losses"], abs=1e-5)
        assert max_abs_diff(got["params"], want["params"]) < 1e-3
        held = {}
        for rank in results:  # under pp each stage reports its own layers
            for layer, bias in rank[i]["biases"].items():
                assert torch.equal(held.setdefault(layer, bias), bias)  # alike on a stage
        assert held.keys() == want["biases"].keys()
        for layer, bias in want["biases"].items():
            assert torch.equal(held[layer], bias), layer


def test_sequence_balance_loss_by_hand():
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(3, 5, 4, generator=g, dtype=torch.float64)
    chosen = scores.topk(2, -1).indices
    total = 0.0
    for s, c in zip(scores, chosen):  # eq. 17-20 for each sequence
        t, e, k = 5, 4, 2
        f = [e / (k * t) * sum(int(i in row) for row in c.tolist()) for i in range(e)]
        p = [sum(s[j, i] / s[j].sum() for j in range(t)) / t for i in range(e)]
        total += 0.01 * float(sum(fi * pi for fi, pi in zip(f, p)))
    got = sequence_balance_loss(scores, chosen, 0.01)
    assert got.item() == pytest.approx(total / 3, rel=1e-12)
    uniform = torch.ones(1, 4, 4, dtype=torch.float64)
    balanced = torch.tensor([[[0, 1], [2, 3], [0, 1], [2, 3]]])
    assert sequence_balance_loss(uniform, balanced, 0.01).item() == pytest.approx(0.01)


def test_nodes_per_token():
    chosen = torch.tensor([[0, 1, 2, 3], [0, 4, 8, 12], [15, 3, 14, 2], [5, 5, 5, 5]])
    assert nodes_per_token(chosen, 4).tolist() == [1, 4, 2, 1]
    assert nodes_per_token(chosen, 16).tolist() == [1, 1, 1, 1]
    assert nodes_per_token(chosen[:, :1], 4).tolist() == [1, 1, 1, 1]


def test_the_trainer_updates_the_bias_and_a_resume_on_another_layout_keeps_it(tmp_path):
    """`train --moe-bias-update-speed 0.5`: 1 step under dp_shard 2 · ep 2, saved, resumed
    to step 3 under pp 2, equal to the trainer's one-process run of 3 steps (the bias a
    buffer of the checkpoint). γ = 0.5 against affinities in (0, 1): the biases decide the
    routing, so a resume that lost them would route steps 2 and 3 otherwise."""
    from minidist.trainer.cli import parse
    from minidist.trainer.loop import reference

    ids = torch.randint(3, 128, (32, 16), generator=torch.Generator().manual_seed(1)).numpy()
    __import__("numpy").savez(tmp_path / "rows.npz", input_ids=ids, labels=ids)
    ck = str(tmp_path / "ck")
    run = [
        "--model",
        "deepseek_runs:deepseek_factory",
        "--data",
        str(tmp_path / "rows.npz"),
        "--moe-bias-update-speed",
        "0.5",
        "--steps",
    ]
    before = [*run, "1", "--dp-shard", "2", "--ep", "2", "--save", ck]
    after = [*run, "3", "--pp", "2", "--resume", ck]
    saved = minidist.launch(deepseek_runs.trained, 2, [before], timeout_s=600, idle_s=HUNG_S)[0][0]
    key = "model.layers.1.mlp.gate.e_score_correction_bias"  # read back from the checkpoint
    bias = minidist.launch(
        deepseek_runs.saved_tensor, 1, ck, key, (8,), timeout_s=600, idle_s=HUNG_S
    )[0]
    assert set((bias / 0.5).tolist()) <= {-1, 0, 1} and bias.abs().max() > 0  # one step
    resumed = minidist.launch(deepseek_runs.trained, 2, [after], timeout_s=600, idle_s=HUNG_S)[0][0]
    want = reference(parse(after))
    assert saved["losses"] == pytest.approx(want["losses"][:1], abs=1e-5)
    assert resumed["resumed_from"] == 1
    assert resumed["losses"] == pytest.approx(want["losses"][1:], abs=1e-5)
    assert max_abs_diff(resumed["params"], want["params"]) < 1e-3


def test_export_hf_keeps_the_trained_routing_bias(tmp_path):
    """`train --moe-bias-update-speed 0.5 --pp 2 --export-hf DIR`: the bias (a persistent
    buffer, held by the last stage; rank 0 writes the folder) is in what `from_pretrained`
    loads, equal to the trained one and to the one-process run's, and not zero (3 steps:
    at γ = 0.5 step 2 moves every expert back to 0 on these rows)."""
    transformers = pytest.importorskip("transformers")
    from minidist.trainer.cli import parse
    from minidist.trainer.loop import reference

    ids = torch.randint(3, 128, (32, 16), generator=torch.Generator().manual_seed(1)).numpy()
    __import__("numpy").savez(tmp_path / "rows.npz", input_ids=ids, labels=ids)
    out = tmp_path / "hf"
    run = [
        "--model",
        "deepseek_runs:deepseek_factory",
        "--data",
        str(tmp_path / "rows.npz"),
        "--moe-bias-update-speed",
        "0.5",
        "--steps",
        "3",
        "--pp",
        "2",
    ]
    got = minidist.launch(
        deepseek_runs.trained, 2, [[*run, "--export-hf", str(out)]], timeout_s=600, idle_s=HUNG_S
    )[0][0]
    back = transformers.AutoModelForCausalLM.from_pretrained(out)
    key = "model.layers.1.mlp.gate.e_score_correction_bias"
    bias, want = back.get_buffer(key), reference(parse(run))["buffers"][key]
    assert bias.abs().max() > 0 and torch.equal(bias, want)
    assert torch.equal(bias, got["buffers"][key])
    assert max_abs_diff(dict(back.named_parameters()), got["params"]) == 0.0


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--moe-bias-update-speed", "-0.1"], "--moe-bias-update-speed=-0.1 must be a finite"),
        (["--moe-bias-update-speed", "nan"], "--moe-bias-update-speed=nan must be a finite"),
        (["--model", "llama", "--moe-bias-update-speed", "0.1"], "the llama model has no router"),
        (
            ["--model", "hf_models:qwen2_factory", "--moe-bias-update-speed", "1e-3"],
            "the factory model has no router",
        ),
    ],
)
def test_bad_speeds_and_models_without_a_biased_router_exit_2(capsys, argv, words):
    from minidist.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["train", *argv])
    assert e.value.code == 2
    assert words in capsys.readouterr().err.strip().splitlines()[-1]


def test_load_over_steps_is_the_routed_tokens_of_each_step():
    from minidist.deepseek.moe import load_over_steps

    loads = load_over_steps(0.01, steps=2)
    assert loads.shape == (2, 2, 8)  # steps, MoE layers, experts
    assert (loads.sum(-1) == 16 * 32 * 2).all()  # every token's 2 choices


def test_the_routing_picture_draws_one_panel_per_run():
    import matplotlib

    matplotlib.use("Agg")
    from minidist.deepseek.plots_routing import plot_expert_load

    loads = torch.randint(0, 50, (4, 2, 8), generator=torch.Generator().manual_seed(0))
    fig = plot_expert_load({"γ = 0": loads, "γ = 0.01": loads.flip(0)}, layer=1)
    assert [ax.get_title() for ax in fig.axes] == ["γ = 0", "γ = 0.01"]
    assert len(fig.axes[0].lines) == 8 + 2  # the experts, max / mean, the balanced line
    with pytest.raises(ValueError, match="layer 2 in range"):
        plot_expert_load({"x": loads}, layer=2)


def test_a_bf16_model_keeps_its_bias_in_float32():
    model = hf_models.build("deepseek_v3", layers=2, **deepseek_runs.ROUTING).to(torch.bfloat16)
    count_expert_load(model)
    ((name, router),) = routers(model)
    with torch.no_grad():  # a bias far from 0, where bf16's step is 2^-7 > γ
        getattr(router, BIAS).fill_(0.5)
    model(input_ids=hf_models.batches(1, 2, 8)[0][0])
    load = update_routing_bias(model, 0.001)[name]
    bias = dict(model.named_buffers())[f"{name}.{BIAS}"]  # still the model's buffer
    assert bias.dtype == torch.float32
    assert torch.equal(bias, bias_step(torch.full((8,), 0.5), load, 0.001))
    assert (bias != 0.5).any()
