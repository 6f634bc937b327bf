"""`python -m minidist plan` as a learner meets it: every bad option refused at parse time in
argparse's own format (exit status 2, the option named), large sizes answered fast, and the
output saying what it planned, against which budget, and what to change when nothing fits.
In process (`minidist.__main__.main`), one call per case, no subprocess."""

import re

import pytest

from minidist.__main__ import main

GPT = ["--layers", "4", "--hidden", "256", "--heads", "8", "--vocab", "1000", "--seq", "128"]
PARAMS = ["--params", "1e9"]


def _run(capsys, *args: str) -> tuple[str, str]:
    assert main(["plan", *args]) == 0
    out = capsys.readouterr()
    return out.out, out.err


def _values(out: str) -> dict[str, str]:
    """name -> value (the first word after '=')."""
    return {
        name: rest.split(" ", 1)[0]
        for name, rest in (line.split("=", 1) for line in out.splitlines() if "=" in line[:60])
    }


@pytest.mark.parametrize(
    "args, words",
    [
        ([*PARAMS, "--world", "0"], ["argument --world", ">= 1"]),
        ([*PARAMS, "--world", "8", "--tp", "0"], ["argument --tp", ">= 1"]),
        ([*PARAMS, "--world", "8", "--pp", "0"], ["argument --pp", ">= 1"]),
        ([*PARAMS, "--world", "8", "--dp", "0"], ["argument --dp", ">= 1"]),
        ([*PARAMS, "--world", "-4"], ["argument --world", ">= 1"]),
        ([*PARAMS, "--world", "2.5"], ["argument --world", "whole number"]),
        ([*PARAMS, "--world", "abc"], ["argument --world", "whole number"]),
        ([*PARAMS, "--world", "1e22"], ["argument --world", "10^21"]),
        (["--params", "nan", "--world", "8"], ["argument --params", "finite"]),
        (["--params", "inf", "--world", "8"], ["argument --params", "finite"]),
        (["--params", "-5", "--world", "8"], ["argument --params", "> 0"]),
        (["--params", "0.3", "--world", "8"], ["argument --params", "between 1"]),
        ([*GPT[:2], "--hidden", "1000000000", *GPT[4:], "--world", "8"], ["hidden", "64-bit"]),
        (["--layers", "1e12", *GPT[2:], "--world", "8"], ["--layers 1000000000000", "at most"]),
        ([*GPT[:4], "--heads", "7", *GPT[6:], "--world", "8"], ["--hidden 256", "--heads 7"]),
        ([*GPT, "--world", "8", "--micro-batch", "0"], ["argument --micro-batch", ">= 1"]),
        ([*GPT, "--world", "8", "--microbatches", "0"], ["argument --microbatches", ">= 1"]),
        ([*GPT, "--world", "8", "--global-batch", "0"], ["argument --global-batch", ">= 1"]),
        ([*GPT, "--world", "8", "--pp", "2", "--virtual", "3"], ["--virtual 3", "interleaved"]),
        ([*GPT, "--world", "8", "--virtual", "0"], ["argument --virtual", ">= 1"]),
        ([*GPT, "--world", "8", "--memory-gib", "-1"], ["argument --memory-gib", "> 0"]),
        ([*GPT, "--world", "8", "--memory-gib", "nan"], ["argument --memory-gib", "finite"]),
        ([*GPT, "--world", "8", "--memory-gib", "inf"], ["argument --memory-gib", "finite"]),
        ([*GPT, "--world", "8", "--top", "0"], ["argument --top", ">= 1"]),
        ([*PARAMS, "--world", "6", "--tp", "4"], ["--world 6", "--tp 4"]),
        ([*PARAMS, "--world", "8", "--dp", "2", "--tp", "2"], ["--dp 2", "--world 8"]),
        ([*PARAMS, "--world", "8", "--shard-size", "3", "--zero", "3"], ["--shard-size 3"]),
        (
            [*PARAMS, "--world", "8", "--reduce-dtype", "bf16", "--precision", "fp32"],
            ["--reduce-dtype bf16", "--precision mixed"],
        ),
        ([*PARAMS, "--world", "8", "--tp", "2"], ["tp=2", "configuration"]),
        ([*PARAMS, *GPT, "--world", "8"], ["not both"]),
        (["--layers", "4", "--world", "8"], ["missing", "--hidden"]),
        ([*GPT, "--world", "16", "--pp", "16"], ["pp=16", "layers=4"]),
        (
            [*GPT, "--world", "8", "--global-batch", "16", "--micro-batch", "3"],
            ["micro-batches of 3 sequences"],
        ),
        (
            [*GPT, "--world", "8", "--global-batch", "12", "--micro-batch", "1"],
            ["micro-batches of 1 sequence over"],
        ),
        ([*GPT, "--world", "8", "--zero", "2", "--optimizer", "sgd"], ["zero=2", "Adam"]),
        ([*GPT, "--world", "8", "--schedule", "2f2b"], ["argument --schedule", "invalid choice"]),
        ([*GPT, "--world", "8", "--sp"], ["--sp", "--tp > 1"]),
        ([*GPT, "--world", "8", "--tp", "2", "--pp", "2", "--sp"], ["--sp", "--pp 2"]),
        ([*GPT, "--world", "8", "--cp", "0"], ["argument --cp", ">= 1"]),
        ([*GPT, "--world", "8", "--cp", "3"], ["--world 8", "--cp 3"]),
        ([*GPT, "--world", "8", "--cp", "2", "--tp", "2"], ["--cp 2", "--tp 2", "DDP"]),
        ([*GPT, "--world", "8", "--cp", "2", "--zero", "1"], ["--cp 2", "--zero 1"]),
        ([*GPT, "--world", "8", "--dp", "2", "--cp", "2"], ["--dp 2", "--cp 2", "--world 8"]),
        ([*GPT[:8], "--seq", "12", "--world", "8", "--cp", "8"], ["cp=8", "seq=12"]),
        (
            [*GPT, "--world", "4", "--pp", "2", "--tp", "2", "--schedule", "zb-v"],
            ["schedule='zb-v'", "tp=2"],
        ),
        (
            [*GPT, "--world", "2", "--pp", "2", "--schedule", "dualpipev", "--microbatches", "2"],
            ["dualpipev", "microbatches=2"],
        ),
    ],
)
def test_bad_option_is_refused_in_argparse_format(capsys, args, words):
    with pytest.raises(SystemExit) as exit_:
        main(["plan", *args])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "usage: python -m minidist plan" in err and "error:" in err, err
    assert "Traceback" not in err
    for word in words:
        assert word in err, (word, err)


@pytest.mark.parametrize(
    "args",
    [
        [*PARAMS, "--world", "100000000000000000000"],
        [*PARAMS, "--world", "1e20", "--zero", "3"],
        [*GPT, "--world", "1e20", "--micro-batch", "1"],
        [*GPT, "--world", "18446744073709551557"],  # a prime: Miller-Rabin, no search
        [*GPT, "--world", str(1000000007 * 998244353)],  # two primes: Pollard's rho
    ],
)
def test_huge_worlds_are_answered(capsys, args):
    """The sweep factors the world instead of counting 1..n (which took minutes); counts
    are never timed here, only answered."""
    out, _ = _run(capsys, *args)
    assert "fits=" in out


def test_help_prints_each_default_once(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    helps = capsys.readouterr().out.split("options:", 1)[1]
    blocks = {}  # option -> its help text, joined
    for block in re.split(r"\n  (?=--)", helps):
        blocks[block.split()[0]] = " ".join(block.split())
    for option in ("--tp", "--dp", "--optimizer", "--cluster", "--reduce-dtype", "--virtual"):
        assert blocks[option].count("default") == 1, blocks[option]
    assert "dgx-a100: A100 SXM 80 GB" in blocks["--cluster"]
    assert "two fp32 moments" in blocks["--optimizer"]


def test_params_only_never_claims_a_fit(capsys):
    """A parameter count plans no activations: fits is unknown when the states fit, no when
    they alone do not, and the output says which budget it was judged against."""
    out, _ = _run(capsys, "--params", "175e9", "--world", "1024", "--zero", "3")
    values = _values(out)
    assert values["activations_bytes_per_rank"] == "not_planned"
    assert values["fits"] == "unknown" and "activations are not planned" in out
    assert int(values["budget_bytes_per_rank"]) == 80 * 10**9
    out, _ = _run(capsys, "--params", "175e9", "--world", "8", "--zero", "3")
    assert _values(out)["fits"] == "no" and "model states alone" in out


def test_output_names_units_budget_and_reduce_dtype(capsys):
    out, _ = _run(capsys, *GPT, "--world", "8", "--memory-gib", "2", "--reduce-dtype", "bf16")
    values = _values(out)
    assert values["fits"] == "yes" and "of 2.15 GB per rank" in out
    assert values["budget_bytes_per_rank"] == str(2 * 2**30) and "--memory-gib" in out
    assert values["grad_reduce_dtype"] == "bf16"
    assert re.search(r"model_state_bytes_per_rank=\d+ \(\d+\.\d\d MB, \d+\.\d\d MiB\)", out)
    fp32, _ = _run(capsys, *GPT, "--world", "8")
    assert _values(fp32)["grad_reduce_dtype"] == "fp32"
    sent = [int(_values(o)["bytes_sent[all_reduce@dp]"]) for o in (out, fp32)]
    assert sent[0] * 2 == sent[1]  # bf16 gradients: half the bytes


def test_activations_decide_the_fit(capsys):
    """A budget above the model states but below states + activations: fits=no."""
    out, _ = _run(capsys, *GPT, "--world", "8")
    values = _values(out)
    states, total = int(values["model_state_bytes_per_rank"]), int(values["memory_bytes_per_rank"])
    assert int(values["activations_bytes_per_rank"]) == total - states > 0
    budget_gib = str((states + total) / 2 / 2**30)
    out, _ = _run(capsys, *GPT, "--world", "8", "--memory-gib", budget_gib)
    assert _values(out)["fits"] == "no"


def test_nothing_fits_says_what_to_change(capsys):
    out, _ = _run(capsys, *GPT, "--world", "8", "--memory-gib", "0.001")
    assert "(0 fit in" in out and "# none fits: the smallest" in out
    assert "--recompute" in out and "--memory-gib" in out


def test_pipeline_note_says_one_micro_batch(capsys):
    out, err = _run(capsys, *GPT, "--world", "4", "--pp", "4", "--microbatches", "1")
    assert _values(out)["bubble"] == "0.7500"
    assert "pp=4 with 1 micro-batch leaves" in err


@pytest.mark.parametrize("kind", ["zb-v", "dualpipev"])
def test_v_schedules_are_planned(capsys, kind):
    """Rank 0 holds virtual stages 0 and 3 of 4: the embedding and the head, both its sends."""
    out, _ = _run(
        capsys,
        *GPT,
        "--world",
        "2",
        "--pp",
        "2",
        "--schedule",
        kind,
        "--microbatches",
        "4",
        "--global-batch",
        "8",
        "--precision",
        "fp32",
    )
    values = _values(out)
    assert "bytes_sent[all_reduce@pp]" not in values  # the tied copies meet on rank 0
    assert int(values["bytes_sent[p2p@pp]"]) == 2 * 4 * 8 * 128 * 256  # out and back, fp32
    assert 0 < float(values["bubble"]) < 0.2


def test_the_sweep_of_an_sgd_pipeline_leaves_out_zero_without_adam(capsys):
    """`--pp 2 --optimizer sgd` plans its layout, then sweeps every other one of the world:
    the dp-only layouts with ZeRO 1-3 step Adam only, so they are left out of the sweep (they
    were planned and raised there, after the chosen plan had been printed)."""
    out, _ = _run(capsys, *GPT, "--world", "4", "--pp", "2", "--optimizer", "sgd")
    layouts = [line for line in out.splitlines() if line.startswith("layout=")]
    assert layouts and not any("tp1.pp1.zero" in line and "zero0" not in line for line in layouts)


def test_sp_and_cp_are_planned_and_swept(capsys):
    """--sp: reduce-scatters and all-gathers on tp, the sweep keeps sequence parallelism;
    --cp: the ring on cp, the gradients over the data × context ranks."""
    out, _ = _run(capsys, *GPT, "--world", "8", "--tp", "4", "--sp")
    values = _values(out)
    assert int(values["bytes_sent[reduce_scatter+all_gather@tp]"]) > 0
    assert "layout=dp2.tp4.pp1.zero0.sp " in out
    assert all(".sp " in line for line in out.splitlines() if line.startswith("layout="))
    out, _ = _run(capsys, *GPT, "--world", "8", "--cp", "4")
    values = _values(out)
    assert int(values["bytes_sent[p2p@cp]"]) > 0 and int(values["bytes_sent[all_reduce@dp-cp]"]) > 0
    assert "layout=dp2.tp1.pp1.zero0.cp4 " in out


def test_experts_are_planned_and_their_placements_ranked(capsys):
    """--experts/--ep: the padded all-to-alls on ep, the experts' gradients over dp/ep, one
    micro-batch by default; the activations an upper bound that judges the fit, and every
    ep dividing dp and E swept, fastest first."""
    out, _ = _run(capsys, *GPT, "--experts", "8", "--top-k", "2", "--world", "8", "--ep", "4")
    values = _values(out)
    assert int(values["bytes_sent[all_to_all@ep]"]) > 0
    assert int(values["bytes_sent[all_reduce@edp]"]) > 0
    assert int(values["activations_bytes_per_rank"]) > 0
    assert values["activations_bound"] == "upper" and values["fits"].startswith("yes")
    placements = [line for line in out.splitlines() if line.startswith("layout=")]
    assert {line.split()[0] for line in placements} == {
        f"layout=dp8.tp1.pp1.zero0{e}" for e in ("", ".ep2", ".ep4", ".ep8")
    }
    times = [float(line.split("step_time_s=")[1].split()[0]) for line in placements]
    assert times == sorted(times)
    out, _ = _run(capsys, *GPT, "--experts", "8", "--world", "8", "--memory-gib", "0.001")
    assert "# none fits: the smallest, dp8.tp1.pp1.zero0.ep8," in out
    assert "--recompute" not in out.split("# none fits")[1]  # not with experts


@pytest.mark.parametrize(
    "args, words",
    [
        (["--experts", "4", "--top-k", "5", "--world", "4"], "--top-k 5 must be an int in 1.."),
        (["--experts", "8", "--world", "4", "--ep", "3"], "ep=3 must divide dp=4"),
        (["--experts", "8", "--world", "8", "--tp", "2"], "experts=8 with tp=2"),
        (["--world", "4", "--ep", "2"], "ep=2 needs a model with experts"),
        (["--experts", "8", "--capacity-factor", "0", "--world", "4"], "0 must be"),
    ],
)
def test_bad_expert_options_are_named(capsys, args, words):
    with pytest.raises(SystemExit) as exit_:
        _run(capsys, *GPT, *args)
    assert exit_.value.code == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra",
    [
        ["--micro-batch", "1", "--global-batch", "64", "--zero", "1"],
        ["--micro-batch", "2", "--global-batch", "32", "--tp", "2"],
        ["--micro-batch", "1", "--global-batch", "16", "--zero", "3"],
        ["--micro-batch", "4", "--global-batch", "64", "--pp", "2"],
    ],
)
def test_the_chosen_layout_in_the_sweep_has_the_same_memory(capsys, extra):
    """`--micro-batch b` means micro-batches of b sequences for every layout of the sweep, as
    for the chosen one (a sweep that ran a replica's batch at once listed the chosen ZeRO-1
    layout at twice its memory)."""
    big = ["--layers", "8", "--hidden", "1024", "--heads", "16", "--vocab", "32000"]
    out, _ = _run(
        capsys,
        *big,
        "--seq",
        "1024",
        "--world",
        "8",
        "--top",
        "1000",
        "--memory-gib",
        "1000",
        *extra,
    )
    chosen = int(_values(out)["memory_bytes_per_rank"]) / 2**30
    listed = {
        m.group(1): float(m.group(2))
        for m in re.finditer(r"^layout=(\S+) m=\d+ memory_gib=([\d.]+)", out, re.M)
    }
    tp = extra[extra.index("--tp") + 1] if "--tp" in extra else "1"
    pp = extra[extra.index("--pp") + 1] if "--pp" in extra else "1"
    zero = extra[extra.index("--zero") + 1] if "--zero" in extra else "0"
    dp = 8 // (int(tp) * int(pp))
    name = f"dp{dp}.tp{tp}.pp{pp}.zero{zero}"
    assert name in listed, (name, sorted(listed))
    assert abs(listed[name] - chosen) < 0.006, (name, listed[name], chosen)
