"""`python -m minidist plan` with a `train` run's options (issue 34): it accepts exactly the
layouts `train` accepts, refuses the others with `train`'s line (exit 2, no rank started),
and its figures are the ones `train` prints beside what it measured, which equal them to the
byte (the experts' exchange follows the routing: the measured bytes never exceed the
planned bound, and padded to capacity they equal the padded plan)."""

import contextlib
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from worlds import HUNG_S

import minidist
from minidist.__main__ import main
from minidist.compose import theory
from minidist.compose.dims import Grid, ParallelDims
from minidist.compose.fixture import build, bytes_by_kind, data_rows, one_step
from minidist.compose.parallelize import parallelize
from minidist.trainer.cli import check_run, parser


def _lines(capsys, argv: list[str]) -> dict:
    assert main(argv) == 0
    out = capsys.readouterr().out
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


LAYOUTS = [  # 4, 6 and 8 ranks: experts under tp, an odd data group with ZB-V on 5 layers
    # (offloaded), cp with sp and HSDP in bf16 with recomputation, FSDP with tp and pp, ZeRO-2
    # (offloaded)
    ["--model", "moe", "--dp-shard", "2", "--ep", "2", "--tp", "2", "--recompute"],
    ["--model", "llama", "--dp-shard", "3", "--pp", "2", "--schedule", "zb-v", "--layers", "5",
     "--global-batch", "6", "--optimizer-cpu-offload"],
    ["--model", "gpt", "--dp-replicate", "2", "--cp", "2", "--tp", "2", "--sp", "--precision",
     "bf16", "--recompute"],
    ["--model", "llama", "--dp-shard", "2", "--tp", "2", "--pp", "2", "--dp-shard-mode",
     "optim_grads_params"],  # FSDP per layer
    ["--model", "gpt", "--dp-shard", "4", "--dp-shard-mode", "optim_grads",
     "--optimizer-cpu-offload"],  # ZeRO-2
]  # fmt: skip


@pytest.mark.parametrize("argv", LAYOUTS)
def test_plan_prints_what_train_plans_and_measures(capsys, argv):
    run = ["--steps", "1", *argv]
    planned = _lines(capsys, ["plan", *run])
    trained = _lines(capsys, ["train", *run])
    kinds = [k for k in planned if k.startswith("planned_")]
    assert len(kinds) >= 8, planned
    assert planned["world_size"] == trained["world_size"]
    for name in kinds:
        assert planned[name] == trained[name], (name, planned, trained)
        measured = name.removeprefix("planned_").removesuffix("_bound")
        if name.endswith("_bound"):
            assert 0 < float(trained[measured]) <= float(planned[name]), name
        else:
            assert float(trained[measured]) == float(planned[name]), (name, trained)
    assert "planned_memory_activations" in kinds, kinds  # the activations' peak too


@pytest.mark.parametrize(
    "argv",
    [
        ["--model", "llama", "--cp", "3"],  # zig-zag: the sequence in 2·cp pieces
        ["--model", "llama", "--heads", "8", "--tp", "3"],
        ["--model", "llama", "--kv-heads", "3"],
        ["--model", "gpt", "--pp", "5"],  # more stages than lesson 17's 4 layers
        ["--model", "gpt", "--dp-shard", "3"],  # a global batch of 8 over 3 data ranks
        ["--model", "moe", "--dp-shard", "2", "--ep", "4"],
        ["--model", "gpt", "--schedule", "interleaved", "--pp", "2", "--virtual", "3"],
        ["--model", "gpt", "--eps", "nan"],
    ],
)
def test_plan_refuses_what_train_refuses_with_the_same_line(capsys, argv):
    assert _error(capsys, ["plan", *argv]) == _error(capsys, ["train", *argv]).replace(
        "minidist train", "minidist plan"
    )


def test_lesson_13s_planner_keeps_its_options():
    """Without a train-only option, `plan` is lesson 13's analytic planner."""
    from minidist.trainer.plan import wanted

    assert not wanted(["--world", "8", "--params", "7e9", "--tp", "2"])
    assert wanted(["--model=llama"]) and wanted(["--dp-shard", "2"])


@settings(max_examples=12, deadline=None)
@given(
    dp_shard=st.sampled_from((1, 2, 3, 5)),
    tp=st.sampled_from((1, 2, 3, 4)),
    pp=st.sampled_from((1, 2, 3, 5)),
    sp=st.booleans(),
    model=st.sampled_from(("gpt", "llama", "moe")),
)
def test_plan_accepts_a_sampled_layout_exactly_when_train_does(dp_shard, tp, pp, sp, model):
    """`plan`'s verdict (its exit and line) against `train`'s checks in the parent, on sizes
    that divide and sizes that do not."""
    argv = [
        *("--model", model, "--dp-shard", str(dp_shard), "--tp", str(tp), "--pp", str(pp)),
        *(["--sp"] if sp else []),
        *("--global-batch", "6", "--layers", "4"),
    ]
    try:
        check_run(parser().parse_args(argv))
        train = None
    except ValueError as e:
        train = str(e)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["plan", *argv])
        except SystemExit as e:
            code = e.code
    if train is None:
        assert code == 0 and "planned_memory_params=" in out.getvalue(), err.getvalue()
    else:
        assert code == 2 and err.getvalue().strip().splitlines()[-1].endswith(train)


def _padded_rank(dims: dict) -> dict:
    pdims = ParallelDims(**dims)
    model, batches = build("moe", steps=1)
    grid = Grid(pdims)
    d = pdims.dp_replicate * pdims.dp_shard
    engine = parallelize(model, pdims, grid=grid, microbatches=8 // d, pad_to_capacity=True)
    x, y = batches[0]
    rows = data_rows(grid, 8)
    _, _, ledger, _ = one_step(engine, grid, x[rows.start : rows.stop], y[rows.start : rows.stop])
    return bytes_by_kind(ledger, grid)


@pytest.mark.parametrize("dims", [dict(dp_shard=2, ep=2), dict(dp_shard=2, ep=2, tp=2)])
def test_padded_experts_send_the_padded_plan_to_the_byte(dims):
    got = minidist.launch(
        _padded_rank, ParallelDims(**dims).world_size, dims, timeout_s=300, idle_s=HUNG_S
    )
    model, _ = build("moe")
    want = theory.ep_bytes(model, ParallelDims(**dims), 8, 1, padded=True)
    bound = theory.ep_bytes_bound(model, ParallelDims(**dims), 8, 1)
    assert want > 0
    assert all(r["ep"] == want for r in got), (got, want)
    assert bound != want  # the exact exchange's bound is another figure (counts, fewer rows)
