"""`python -m minidist train` as a trainer (issue 35): models of any size, real data, a TOML
configuration, evaluation, Hugging Face weights in and out, refusals in the parent.

Every run is compared with the same run in one process (`trainer.loop.reference`: the
same model and rows, torch's AdamW, `LambdaLR`, `clip_grad_norm_`). Tolerances are lesson
17's (tests/test_compose.py): losses 1e-5 and parameters 1e-3 in float32, a different
reduction order whose few ulps Adam's 1/√v amplifies where a gradient is near 0. Measured:
losses ≤ 4.8e-7, parameters ≤ 3e-5. The exported folder's logits equal the trained
weights' in the built-in model to 1e-5 (measured 0: the same operations). Data positions
are compared exactly (the sample indices each step trained on).
"""

import argparse
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from worlds import HUNG_S

import minidist
from minidist.compose.dims import ParallelDims
from minidist.models import lm_loss
from minidist.trainer.cli import _planned, check_run, dims_of, parse
from minidist.trainer.data import load_data
from minidist.trainer.loop import prepare, reference, train_rank
from minidist.trainer.models import build_model
from minidist.trainer.options import SAVED_BY, config_path, resolved_toml
from minidist.training import max_abs_diff

TEXT = Path(argparse.__file__)  # real text this machine has: a standard-library module
OPTIM = [
    "--optimizer",
    "adamw",
    "--weight-decay",
    "0.1",
    "--warmup",
    "1",
    "--lr-schedule",
    "cosine",
    "--min-lr",
    "1e-3",
    "--clip-grad",
    "1.0",
]


def _world(argv: list[str]) -> int:
    return ParallelDims(**dims_of(parse(argv))).world_size


def _runs(argvs: list[list[str]]) -> list[dict]:
    return [train_rank(parse(a), dims_of(parse(a))) for a in argvs]


def _close_to_one_process(got: dict, argv: list[str], start: int = 0) -> None:
    want = reference(parse(argv))
    assert got["losses"] == pytest.approx(want["losses"][start:], abs=1e-5), argv
    assert max_abs_diff(got["params"], want["params"]) < 1e-3, argv


def test_models_of_any_size_on_real_data_equal_one_process(tmp_path):
    np.arange(5000, dtype=np.uint16).__mod__(300).astype(np.uint16).tofile(tmp_path / "t.bin")
    sized = [
        [
            "--model",
            "llama",
            "--hidden",
            "48",
            "--heads",
            "6",
            "--kv-heads",
            "2",
            "--ffn",
            "80",
            "--layers",
            "2",
            "--seq-len",
            "32",
            "--data",
            str(TEXT),
            "--dp-shard",
            "2",
            "--tp",
            "2",
            *OPTIM,
            "--steps",
            "3",
        ],
        [
            "--model",
            "gpt",
            "--hidden",
            "48",
            "--heads",
            "4",
            "--layers",
            "2",
            "--vocab",
            "304",
            "--data",
            str(tmp_path / "t.bin"),
            "--seq-len",
            "8",
            "--dp-shard",
            "2",
            "--pp",
            "2",
            *OPTIM,
            "--steps",
            "3",
        ],
    ]
    runs = minidist.launch(_runs, 4, sized, timeout_s=600, idle_s=HUNG_S)[0]
    for argv, got in zip(sized, runs):
        _close_to_one_process(got, argv)
        assert got["samples"] == [0, 1, 2]


def test_a_vocabulary_tp_does_not_divide_is_padded_and_trains_as_one_process(tmp_path):
    """--vocab 257 on tp 2 (sp) and 259 on tp 4 for the llama (its untied head), 257 on
    tp 2 · pp 2 for the gpt (its tied embedding on two stages): the embedding and the head
    padded to a multiple of tp, the padding masked out of the softmax, equal one process.
    What leaves the engine keeps the 257 rows: the whole parameters, the export, and the
    checkpoint, resumed on tp 1 (no padding) as one process."""
    transformers = pytest.importorskip("transformers")
    ck, out = str(tmp_path / "ck"), str(tmp_path / "hf")
    run = ["--data", str(TEXT), "--seq-len", "16", *OPTIM]
    llama = ["--model", "llama", "--vocab", "257", *run]
    padded = [
        [*llama, "--steps", "2", "--tp", "2", "--sp", "--dp-shard", "2", "--save", ck],
        ["--model", "llama", "--vocab", "259", *run, "--steps", "2", "--tp", "4"],
        ["--model", "gpt", "--vocab", "257", *run, "--steps", "2", "--tp", "2", "--pp", "2"],
    ]
    padded[1] += ["--micro-batch", "4"]  # the fewest micro-batches: tests/micro_batches.py
    padded[2] += ["--micro-batch", "2"]
    runs = minidist.launch(_runs, 4, padded, timeout_s=600, idle_s=HUNG_S)[0]
    for argv, got in zip(padded, runs):
        _close_to_one_process(got, argv)
        vocab = int(argv[argv.index("--vocab") + 1])
        embedding = "tok_emb.weight" if "gpt" in argv else "model.embed_tokens.weight"
        assert got["params"][embedding].shape[0] == vocab
        if "llama" in argv:
            assert got["params"]["lm_head.weight"].shape[0] == vocab
    after = [*llama, "--steps", "3", "--dp-shard", "2", "--resume", ck, "--export-hf", out]
    resumed = minidist.launch(_runs, 2, [after], timeout_s=600, idle_s=HUNG_S)[0][0]
    assert resumed["resumed_from"] == 2
    _close_to_one_process(resumed, after, start=2)
    back = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert back.config.vocab_size == 257
    assert max_abs_diff(dict(back.named_parameters()), resumed["params"]) == 0.0


def test_a_resume_on_another_layout_continues_the_data_and_other_data_is_refused(tmp_path):
    ck = str(tmp_path / "ck")
    run = ["--model", "llama", "--data", str(TEXT), "--seq-len", "32", *OPTIM, "--steps"]
    before = [*run, "2", "--dp-shard", "2", "--save", ck]
    after = [*run, "4", "--dp-shard", "2", "--tp", "2", "--resume", ck]
    saved = minidist.launch(_runs, 2, [before], timeout_s=600, idle_s=HUNG_S)[0][0]
    resumed = minidist.launch(_runs, 4, [after], timeout_s=600, idle_s=HUNG_S)[0][0]
    assert saved["samples"] == [0, 1] and resumed["samples"] == [2, 3]  # none repeated
    assert resumed["resumed_from"] == 2
    _close_to_one_process(resumed, after, start=2)
    other = tmp_path / "other.txt"
    other.write_text(TEXT.read_text()[:-1000])
    with pytest.raises(ValueError, match="saved with data .* this run has data"):
        check_run(parse([*run, "4", "--resume", ck, "--data", str(other)]))
    with pytest.raises(ValueError, match="saved with model .*'hidden': 32.* this run has model"):
        check_run(parse([*run, "4", "--resume", ck, "--hidden", "64"]))


def test_keep_last_keeps_the_newest_saves_and_a_resume_goes_on_from_the_newest_complete(
    tmp_path,
):
    """--keep-last 2 --save-every 1 over 5 steps (the writes in the background) leaves
    step_00000004 and step_00000005 and everything of the user's in the folder (a file, a
    folder whose name is not step_<digits>, a step_ folder that is not a complete checkpoint);
    --resume of the folder goes on from step 5's save, the data position too, passing over a
    half-written newer one and the staging folder of a save killed midway."""
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "notes.txt").write_text("mine")
    (ck / "step_x").mkdir()
    (ck / "step_00000099").mkdir()  # half-written: no checksums file
    (ck / "step_00000099" / "__0_0.distcp").write_bytes(b"half")
    run = ["--model", "llama", "--data", str(TEXT), "--seq-len", "32"]  # constant lr: any total
    keep = ["--save", str(ck), "--save-every", "1", "--keep-last", "2"]
    before = [*run, "--steps", "5", "--dp-shard", "2", *keep, "--async-save"]
    check_run(parse(before))
    saved = minidist.launch(_runs, 2, [before], timeout_s=600, idle_s=HUNG_S)[0][0]
    users = ["notes.txt", "step_00000099", "step_x"]
    assert sorted(p.name for p in ck.iterdir()) == sorted(
        ["step_00000004", "step_00000005", *users]
    )
    assert saved["samples"] == [0, 1, 2, 3, 4]
    (ck / ".step_00000006.unfinished").mkdir()  # a save of step 6 killed midway
    (ck / ".step_00000006.unfinished" / "__0_0.distcp").write_bytes(b"half")
    after = [*run, "--steps", "7", "--tp", "2", "--resume", str(ck), *keep]
    check_run(parse(after))  # the parent reads step 5's record too
    resumed = minidist.launch(_runs, 2, [after], timeout_s=600, idle_s=HUNG_S)[0][0]
    assert resumed["resumed_from"] == 5 and resumed["samples"] == [5, 6]
    _close_to_one_process(resumed, after, start=5)
    assert sorted(p.name for p in ck.iterdir()) == sorted(
        ["step_00000006", "step_00000007", *users]
    )
    other = tmp_path / "other.txt"
    other.write_text(TEXT.read_text()[:-1000])
    with pytest.raises(ValueError, match="step_00000007: saved with data .* this run has data"):
        check_run(parse([*run, "--steps", "9", "--resume", str(ck), "--data", str(other)]))
    with pytest.raises(ValueError, match="holds checkpoints to step_00000007 of another run"):
        check_run(parse([*run, "--steps", "9", *keep]))  # a fresh run would remove them
    with pytest.raises(ValueError, match="holds --keep-last checkpoints .*pass --keep-last N"):
        check_run(parse([*run, "--steps", "9", "--save", str(ck)]))  # it would replace them
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "minidist.checksums.json").write_text("{}")
    with pytest.raises(ValueError, match="is a checkpoint saved without --keep-last"):
        check_run(parse([*run, "--save", str(plain), "--keep-last", "1"]))


def _export_and_eval(argv: list[str]) -> dict:
    return train_rank(parse(argv), dims_of(parse(argv)))


def test_export_hf_loads_with_from_pretrained_and_the_eval_loss_is_the_held_out_loss(tmp_path):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "hf"
    argv = [
        "--model",
        "llama",
        "--data",
        str(TEXT),
        "--seq-len",
        "32",
        "--steps",
        "3",
        "--dp-shard",
        "2",
        "--eval-every",
        "3",
        "--eval-batches",
        "2",
        "--export-hf",
        str(out),
    ]
    from minidist.__main__ import main

    got = minidist.launch(_export_and_eval, 2, argv, timeout_s=600, idle_s=HUNG_S)[0]
    args = parse(argv)
    data, config, _ = prepare(args)
    trained = build_model(config)
    trained.load_state_dict(got["params"])
    trained.eval()
    hf = transformers.AutoModelForCausalLM.from_pretrained(out)
    every = range(args.global_batch)
    held_out = [data.eval_batch(j, every, args.global_batch) for j in range(2)]
    with torch.no_grad():
        for x, _ in held_out:
            assert (hf(x).logits - trained(x)).abs().max() < 1e-5
        want = sum(lm_loss(trained(x), y).item() for x, y in held_out) / 2
    assert got["evals"] == [(3, pytest.approx(want, abs=1e-5))]
    with pytest.raises(SystemExit):  # never overwritten
        main(["train", *argv])


def test_init_from_hf_trains_a_transformers_model_as_one_process(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    argv = [
        "--init-from-hf",
        str(tmp_path / "llama"),
        "--data",
        str(TEXT),
        "--seq-len",
        "16",
        "--steps",
        "2",
        "--dp-shard",
        "2",
        *OPTIM,
    ]
    got = minidist.launch(_runs, 2, [argv], timeout_s=600, idle_s=HUNG_S)[0][0]
    _close_to_one_process(got, argv)


def test_a_transformers_model_with_ignored_labels_trains_composed_and_exports(tmp_path):
    """The outside contract of issue 33: --init-from-hf a save_pretrained Mistral (a sliding
    window shorter than the rows), --data an .npz whose labels hold -100, on tp 2 (sp) ·
    pp 2, equals one process (the model's own loss: the mean over valid labels), and
    --export-hf writes what from_pretrained loads back."""
    transformers = pytest.importorskip("transformers")
    config = transformers.MistralConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        sliding_window=5,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    transformers.MistralForCausalLM(config).save_pretrained(tmp_path / "mistral")
    g = np.random.default_rng(0)
    ids = g.integers(3, 128, (16, 16))
    labels = np.where(g.random((16, 16)) < 0.2, -100, ids)
    np.savez(tmp_path / "rows.npz", input_ids=ids, labels=labels)
    out = tmp_path / "trained"
    argv = [
        "--init-from-hf",
        str(tmp_path / "mistral"),
        "--data",
        str(tmp_path / "rows.npz"),
        "--steps",
        "2",
        "--tp",
        "2",
        "--sp",
        "--pp",
        "2",
        "--optimizer",
        "adamw",
        "--lr",
        "1e-2",
        "--export-hf",
        str(out),
    ]
    got = minidist.launch(_runs, 4, [argv], timeout_s=600, idle_s=HUNG_S)[0][0]
    _close_to_one_process(got, [a for a in argv if a not in ("--export-hf", str(out))])
    back = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert max_abs_diff(dict(back.named_parameters()), got["params"]) == 0.0


def test_a_users_factory_names_the_model(tmp_path):
    """--model package.module:function: the user's function builds a transformers model
    (tests/hf_models.py's Qwen2, biases), trained composed as in one process."""
    pytest.importorskip("transformers")
    g = np.random.default_rng(1)
    ids = g.integers(3, 128, (16, 16))
    np.savez(tmp_path / "rows.npz", input_ids=ids, labels=np.where(ids % 5 == 0, -100, ids))
    argv = [
        "--model",
        "hf_models:qwen2_factory",
        "--data",
        str(tmp_path / "rows.npz"),
        "--steps",
        "2",
        "--dp-shard",
        "2",
        "--tp",
        "2",
        "--sp",
    ]
    got = minidist.launch(_runs, 4, [argv], timeout_s=600, idle_s=HUNG_S)[0][0]
    _close_to_one_process(got, argv)


def test_active_parameters_count_k_of_the_routed_experts_by_hand():
    """Ψ behind the MFU: the parameters one token meets, counted by hand. Vocabulary 128,
    hidden 32, 2 layers; Mixtral 2 of 4 stacked experts (SwiGLU, f 64); DeepSeek-V3 a dense
    layer, then latent attention, a shared expert and 2 of 4 routed ones (f 16); the course
    MoE 1 of 4 `ModuleList` experts (GELU MLP 4·hidden, biases) and a tied head."""
    hf_models = pytest.importorskip("hf_models")
    from minidist.trainer.loop import active_parameters

    h, ends = 32, 2 * 128 * 32 + 32  # vocabulary 128: embedding, head; final norm
    norms = 2 * h
    mixtral_attention = h * h + 2 * (16 * h) + h * h  # q, k and v (2 KV heads of 8), o
    swiglu = lambda f: 3 * f * h  # noqa: E731  (gate, up, down)
    mixtral_layer = mixtral_attention + 4 * h + 2 * swiglu(64) + norms  # router, 2 experts
    assert active_parameters(hf_models.build("mixtral", layers=2)) == ends + 2 * mixtral_layer
    queries = 16 * h + 16 + 48 * 16  # q_a, its norm, q_b (4 heads of 8 + 4)
    keys_values = 12 * h + 8 + 64 * 8  # kv_a (latent 8, rotary key 4), its norm, kv_b
    latent = queries + keys_values + h * h  # o: 4 heads of 8
    dense = latent + swiglu(64) + norms
    moe = latent + 4 * h + swiglu(16) + 2 * swiglu(16) + norms  # router, shared, 2 routed
    assert active_parameters(hf_models.build("deepseek_v3", layers=2)) == ends + dense + moe

    config = {"model": "moe", "vocab": 64, "seq_len": 16, "layers": 2, "heads": 4, "hidden": h}
    layernorm, expert = 2 * h, (4 * h * h + 4 * h) + (4 * h * h + h)
    block = 2 * layernorm + (3 * h * h + 3 * h) + (h * h + h) + 4 * h + expert  # 1 of 4
    embeddings = 64 * h + 16 * h + layernorm  # tied head; positions; final LayerNorm
    assert active_parameters(build_model(config)) == embeddings + 2 * block


def test_data_rows_are_the_files_tokens(tmp_path):
    text = load_data(str(TEXT), 16)
    raw = np.frombuffer(TEXT.read_bytes(), dtype=np.uint8)
    x, y = text.batch(2, range(1, 3), 8)  # rows 17 and 18
    assert x.tolist() == [raw[r * 16 : r * 16 + 16].tolist() for r in (17, 18)]
    assert y.tolist() == [raw[r * 16 + 1 : r * 16 + 17].tolist() for r in (17, 18)]
    text.split(8, 1)
    text.shuffle(0)  # the trainer's order: one permutation of the training rows, by --seed
    order = np.random.default_rng(0).permutation(text.n_train)
    x, _ = text.batch(2, range(1, 3), 8)
    assert x.tolist() == [raw[r * 16 : r * 16 + 16].tolist() for r in order[17:19]]
    ids = np.random.default_rng(0).integers(0, 50, (12, 6))
    labels = ids.copy()
    labels[:, :2] = -100
    np.savez(tmp_path / "b.npz", input_ids=ids, labels=labels)
    npz = load_data(str(tmp_path / "b.npz"), None)
    x, y = npz.batch(1, range(4), 4)  # step 1 trains on rows 4..7
    assert x.tolist() == ids[4:8].tolist()
    assert y[:, :-1].tolist() == labels[4:8, 1:].tolist() and (y[:, -1] == -100).all()
    tokenizers = pytest.importorskip("tokenizers")
    words = sorted(set(TEXT.read_text().split()))[:500]
    tok = tokenizers.Tokenizer(
        tokenizers.models.WordLevel(
            {w: i for i, w in enumerate(["[UNK]", *words])}, unk_token="[UNK]"
        )
    )
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tok.json"))
    words_data = load_data(str(TEXT), 8, str(tmp_path / "tok.json"))
    assert words_data.vocab == 501
    want = tok.encode(TEXT.read_text(errors="replace")).ids
    assert words_data.batch(0, range(1), 8)[0].tolist() == [want[:8]]


def test_a_config_file_is_read_the_command_line_wins_and_the_resolved_one_repeats_it(tmp_path):
    run = tmp_path / "run.toml"
    run.write_text('model = "llama"\nlr = 3e-4\nglobal-batch = 16\nsp = true\ntp = 2\n')
    args = parse(["--config", str(run), "--lr", "1e-3"])
    assert (args.model, args.lr, args.global_batch, args.sp, args.tp) == (
        "llama",
        1e-3,
        16,
        True,
        2,
    )
    saved = tmp_path / "resolved.toml"
    saved.write_text(resolved_toml(args))
    assert vars(parse(["--config", str(saved)])) == {**vars(args), "config": str(saved)}
    assert config_path(str(tmp_path / "ck")) == tmp_path / "ck.config.toml"


def _main_error(capsys, argv: list[str]) -> str:
    from minidist.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["train", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    return err[-1]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--model", "moe", "--dp-shard", "2", "--ep", "3"], "ep=3 must divide dp_shard × cp"),
        (["--data", "missing.txt"], "--data missing.txt: no such file"),
        (["--data", "{empty}"], "empty (no tokens)"),
        (["--data", "{small}", "--seq-len", "64"], "--seq-len=64 is longer than the data"),
        (["--data", "{small}", "--seq-len", "4"], "fewer than --global-batch=8"),
        (
            ["--data", "{small}", "--seq-len", "2", "--global-batch", "2", "--vocab", "64"],
            "--vocab=64 must exceed the data's largest token id",
        ),
        (["--config", "{bad_toml}"], "unknown key 'bogus'"),
        (["--warmup", "5", "--steps", "5"], "--warmup=5 must be >= 0 and < --steps=5"),
        (["--clip-grad", "0"], "--clip-grad=0.0 must be > 0"),
        (["--model", "no_such_module:build"], "--model no_such_module:build: cannot import it"),
        (["--model", "not a name"], "neither a built-in model"),
        (["--heads", "5"], "--heads=5 must divide --hidden=32"),
        (["--model", "llama", "--kv-heads", "3"], "--kv-heads=3 must divide --heads=4"),
        (["--model", "gpt", "--ffn", "10"], "--ffn=10: the gpt model's MLP is 4·--hidden"),
        (["--model", "llama", "--heads", "8", "--tp", "3"], "tp=3 must divide the heads=8"),
        (["--export-hf", "x"], "--export-hf: the built-in gpt has no Hugging Face class"),
        (["--model", "llama", "--export-hf", "{small}"], "exists and is not an empty folder"),
        (["--keep-last", "2"], "--keep-last=2 needs --save DIR and must be >= 0"),
        (["--save", "ck", "--keep-last", "-1"], "--keep-last=-1 needs --save DIR and must be"),
        (["--betas", "0.9,1"], "--betas=0.9,1.0 must be two numbers B1,B2, each in [0, 1)"),
        (["--betas", "0.9"], "argument --betas: '0.9' is not two numbers B1,B2"),
        (["--eps", "0"], "--eps=0.0 must be a finite number > 0"),
        (["--eps", "nan"], "--eps=nan must be a finite number > 0"),
        (["--micro-batch", "0"], "--micro-batch=0 must be >= 1"),
        (["--micro-batch", "-2"], "--micro-batch=-2 must be >= 1"),
        (["--dp-shard", "3"], "--global-batch=8 must divide by --dp-replicate·--dp-shard·"),
        (["--dp-shard", "2", "--micro-batch", "3"], "must divide by --dp-replicate·--dp-shard"),
        (["--timeout", "0"], "--timeout=0.0 must be a finite number of seconds > 0"),
        (["--timeout", "inf"], "--timeout=inf must be a finite number of seconds > 0"),
        (["--idle-timeout", "0"], "--idle-timeout=0.0 must be a finite number of seconds > 0"),
        (["--idle-timeout", "nan"], "--idle-timeout=nan must be a finite number of seconds"),
        (["--peak-flops", "nan"], "--peak-flops=nan must be a finite number > 0"),
        (["--peak-flops", "-1"], "--peak-flops=-1.0 must be a finite number > 0"),
        (["--layers", "100000"], "--layers=100000 must be at most 1024"),
        (["--hidden", "100000"], "of float32 weights at least, more than this machine's"),
        (["--steps", "100000000"], "would take 218 GB, more than half this machine's"),
        (["--global-batch", "1000000000"], "of the course's text: 5000000000 rows of 16"),
        (["--log", "{nowhere}"], "run.jsonl: its folder"),
        (["--save", "{mine}"], "exists and is not a checkpoint: it would not be replaced"),
        (["--lr", "inf"], "--lr=inf must be > 0 and finite"),
        (["--weight-decay", "inf"], "--weight-decay=inf must be >= 0 and finite"),
        (["--clip-grad", "inf"], "--clip-grad=inf must be > 0 and finite"),
        (["--seed", "-1"], "--seed=-1 must be an int in [0, 2**63)"),
        (["--seed", str(2**64)], f"--seed={2**64} must be an int in [0, 2**63)"),
        (["--async-save"], "--async-save needs --save DIR"),
        (["--die-at", "6"], "--die-at=6 must be a step of the run, in [1, --steps]"),
        (["--die-at", "0"], "--die-at=0 must be a step of the run"),
        (["--die-rank", "3"], "--die-rank needs --die-at STEP"),
        (["--die-once", "{nowhere}"], "--die-once needs --die-at STEP"),
        (["--data", ""], "--data '': an empty path names no file"),
        (["--save", ""], "--save '': an empty path names no file"),
        (["--resume", ""], "--resume '': an empty path names no file"),
        (["--model", "llama", "--export-hf", ""], "--export-hf '': an empty path"),
        (["--resume", "{small}"], "small.txt: not a folder (a checkpoint is a folder)"),
        (["--log", "{small}"], "small.txt: exists and is not a JSONL log"),
        (["--log", "{fifo}"], "fifo: not a regular file (a JSONL log is one)"),
        (["--log", "{mine}"], "is a folder, not a file"),
        (["--config", "{latin1}"], "latin1.toml: not TOML (not UTF-8 text"),
        (["--config", "{fifo}"], "fifo: not a regular file (a FIFO or device is never read)"),
        (["--data", "{fifo}"], "fifo: not a regular file or folder"),
        (["--data", "{odd_bin}"], "3 bytes, not a token file of uint16 ids"),
        (["--data", "{empty_bin}"], "0 bytes, not a token file of uint16 ids"),
        (["--data", "{text_npz}"], "text.npz: not an .npz archive"),
        (["--data", "{npy_npz}"], "npy.npz: an .npy array, not an .npz archive"),
        (["--data", "{object_npz}"], "must be plain integer arrays"),
        (["--data", "{seq1_npz}"], "rows of 1 tokens: a row needs >= 2"),
        (["--data", "{small}", "--tokenizer", "{small}"], "not a tokenizers JSON file"),
        (["--vocab", str(10**13)], "the gpt model (vocab=10000000000000, hidden=32;"),
        (["--model", "llama", "--ffn", str(10**12)], "ffn=1000000000000; --vocab, --hidden"),
        (["--model", "llama", "--export-hf", "{small}/x"], "small.txt is not a folder"),
        (
            ["--model", "llama", "--export-hf", "{nowhere}", "--save", "{nowhere}"],
            "overlaps --save",
        ),
    ],
)
def test_bad_options_are_one_line_and_exit_2_before_any_rank(tmp_path, capsys, argv, words):
    files = {
        "empty": tmp_path / "empty.txt",
        "small": tmp_path / "small.txt",
        "bad_toml": tmp_path / "bad.toml",
        "nowhere": tmp_path / "missing" / "run.jsonl",
        "mine": tmp_path / "mine",  # a user's folder, not a checkpoint
        "fifo": tmp_path / "fifo",  # no reader: an open for writing would wait forever
    }
    os.mkfifo(files["fifo"])
    for name, data in (("odd.bin", b"abc"), ("empty.bin", b""), ("text.npz", b"not a zip")):
        files[name.replace(".", "_")] = tmp_path / name
        files[name.replace(".", "_")].write_bytes(data)
    ids = np.zeros((8, 4), dtype=np.int64)
    for name, arrays in (
        ("npy", None),
        ("object", dict(input_ids=np.array([[1], [1, 2]], dtype=object), labels=ids)),
        ("seq1", dict(input_ids=ids[:, :1], labels=ids[:, :1])),
    ):
        files[f"{name}_npz"] = tmp_path / f"{name}.npz"
        with open(files[f"{name}_npz"], "wb") as f:
            np.save(f, ids) if arrays is None else np.savez(f, **arrays)
    files["latin1"] = tmp_path / "latin1.toml"
    files["latin1"].write_bytes("data = 'caf\u00e9.txt'\n".encode("latin-1"))
    files["mine"].mkdir()
    (files["mine"] / "notes.txt").write_text("keep me")
    files["empty"].write_text("")
    files["small"].write_text("hello world, this is some text")
    files["bad_toml"].write_text("lr = 0.001\nbogus = 1\n")
    argv = [a.format(**{k: str(v) for k, v in files.items()}) for a in argv]
    assert words in _main_error(capsys, argv)
    assert (files["mine"] / "notes.txt").read_text() == "keep me"
    assert files["small"].read_text() == "hello world, this is some text"


def test_a_config_key_may_be_any_long_name_of_its_option(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('log-jsonl = "run.jsonl"\n')  # --log's torchrun spelling
    assert parse(["--config", str(toml)]).log == "run.jsonl"


def test_betas_and_eps_train_as_torchs_adamw_with_the_same_values(tmp_path):
    """--betas 0.5,0.9 --eps 1e-3 on tp 2 equal torch.optim.AdamW(betas=(0.5, 0.9),
    eps=1e-3) in one process; the defaults' run is far from it (the flags are used); the
    TOML keys give the same options."""
    from minidist.compose.optim import torch_optimizer
    from minidist.trainer.options import optimizer_config

    run = ["--model", "llama", "--data", str(TEXT), "--seq-len", "32", "--steps", "3"]
    argv = [*run, "--optimizer", "adamw", "--betas", "0.5,0.9", "--eps", "1e-3", "--tp", "2"]
    got = minidist.launch(_runs, 2, [argv], timeout_s=600, idle_s=HUNG_S)[0][0]
    _close_to_one_process(got, argv)
    args = parse(argv)
    opt, _ = torch_optimizer(build_model(prepare(args)[1]), optimizer_config(args), 3)
    assert type(opt) is torch.optim.AdamW
    assert {(g["betas"], g["eps"]) for g in opt.param_groups} == {((0.5, 0.9), 1e-3)}
    default = reference(parse([*run, "--optimizer", "adamw", "--tp", "2"]))
    assert max_abs_diff(got["params"], default["params"]) > 1e-3
    toml = tmp_path / "run.toml"
    toml.write_text("betas = [0.5, 0.9]\neps = 1e-3\n")
    from_toml = parse(["--config", str(toml)])
    assert (from_toml.betas, from_toml.eps) == ((0.5, 0.9), 1e-3)


def test_the_resolved_config_is_saved_beside_the_checkpoint_and_printed(tmp_path, capsys):
    from minidist.__main__ import main

    ck = tmp_path / "ck"
    assert main(["train", "--model", "llama", "--steps", "1", "--save", str(ck)]) == 0
    saved = config_path(str(ck)).read_text()
    assert saved.startswith(SAVED_BY + "\n") and 'model = "llama"' in saved
    assert saved.split("\n", 1)[1] in capsys.readouterr().err
    record = json.loads(json.dumps(vars(parse(["--config", str(config_path(str(ck)))]))))
    assert record["save"] == str(ck) and record["steps"] == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary


def _hangs_or_fails(how):
    def rank(args, dims, *callbacks):
        import time

        import torch.distributed as dist

        from minidist import comm

        if dist.get_rank() == 1 and how == "fails":
            raise ValueError("a batch this rank cannot take")
        if dist.get_rank() == 1:
            time.sleep(600)  # never joins rank 0's all-reduce
        comm.all_reduce(torch.zeros(1), tag="never-joined")
        return {}

    return rank


@pytest.mark.parametrize("how", ["hangs", "fails"])
def test_a_world_that_hangs_or_loses_a_rank_ends_train_with_its_story_not_a_traceback(
    monkeypatch, capsys, how
):
    """The CLI prints the world's account (the rank that failed first, with its own
    traceback; or where each rank waited once all sat idle `--idle-timeout` seconds), exit
    1. Before, a hang waited out --timeout (900 s), and either ended in the parent's frames
    inside launch, the progress line unterminated before them."""
    import minidist.trainer.loop as loop
    from minidist.__main__ import main

    monkeypatch.setattr(loop, "train_rank", _hangs_or_fails(how))
    argv = ["train", "--model", "llama", "--dp-shard", "2", "--steps", "1"]
    assert main([*argv, "--idle-timeout", "2", "--timeout", "60"]) == 1
    err = capsys.readouterr().err
    story = err[err.index("\npython -m minidist train: ") :]
    assert "minidist/runtime/parent.py" not in err and "Traceback" not in err[: err.index(story)]
    if how == "hangs":
        assert "WorldTimeoutError: ranks [0, 1] all sat idle (no CPU used) for idle_s=2" in story
        assert "rank 0: inside all_reduce (tag 'never-joined')" in story
    else:
        assert "RankFailedError: rank 1 failed" in story
        assert "ValueError: a batch this rank cannot take" in story


@pytest.mark.parametrize("kind", ["file", "folder", "link", "saved by an older minidist"])
def test_a_users_file_where_the_config_is_saved_is_refused_and_kept(tmp_path, capsys, kind):
    """`--save DIR` writes DIR.config.toml: a file there that train did not write is the
    user's (never overwritten: one line, exit 2, before any rank); one train wrote is
    replaced at the next save, whole (a temporary file, then a rename)."""
    path = config_path(str(tmp_path / "ck"))
    mine = tmp_path / "mine.txt"
    mine.write_text("keep me")
    if kind == "file":
        path.write_text("my notes\n")
    elif kind == "folder":
        path.mkdir()
    elif kind == "link":
        path.symlink_to(mine)
    else:
        path.write_text('model = "llama"\n')
    before = path.read_text() if path.is_file() else None
    argv = ["--model", "llama", "--steps", "1", "--save", str(tmp_path / "ck")]
    assert "was not written by train: never overwritten" in _main_error(capsys, argv)
    assert (path.read_text() if path.is_file() else None) == before
    assert mine.read_text() == "keep me" and not (tmp_path / "ck").exists()


def test_plot_run_draws_a_log_and_refuses_what_is_not_one(tmp_path, capsys):
    from minidist.__main__ import main

    memory = {"params": 100, "grads": 100, "master": 50, "optimizer": 100, "activations": 7}
    lines = [
        {
            "step": s,
            "loss": 3.0 - s / 10,
            "tokens_per_s": 100.0 + s,
            "memory_per_rank": [memory, memory],
            **({"eval_loss": 2.9} if s == 2 else {}),
        }
        for s in (1, 2, 2, 3)
    ]  # step 2 twice: a resumed run's log
    log = tmp_path / "run.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert main(["plot-run", str(log)]) == 0
    assert (tmp_path / "run.png").stat().st_size > 0
    good = json.dumps(lines[0])
    for text, why in [
        ("not json", "line 1: Expecting value"),
        (f"{good}\n3", "line 2: 3 is not a step's record"),
        ("[1, 2]", "[1, 2] is not a step's record"),
        ('{"loss": 1.0, "tokens_per_s": 1.0}', "step=None is not a step number"),
        ('{"step": true, "loss": 1.0, "tokens_per_s": 1.0}', "step=True is not"),
        ('{"step": -1, "loss": 1.0, "tokens_per_s": 1.0}', "step=-1 is not"),
        ('{"step": 1, "loss": 1.0}', "tokens_per_s=None is not a number"),  # a log by hand
        ('{"step": 1, "loss": "1.0", "tokens_per_s": 1.0}', "loss='1.0' is not a number"),
        ('{"step": 1, "loss": 1, "tokens_per_s": 1, "eval_loss": null}', "eval_loss=None"),
        ('{"step": 1, "loss": 1, "tokens_per_s": 1, "memory_per_rank": [{"a": "x"}]}', "memo"),
        ('{"step": 1, "loss": 1, "tokens_per_s": 1, "memory_per_rank": [{"a": 1}, {}]}', "memo"),
    ]:
        (tmp_path / "bad.jsonl").write_text(text + "\n")
        with pytest.raises(SystemExit) as e:
            main(["plot-run", str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "bad.png")])
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert e.value.code == 2 and "is not a train --log file" in err and why in err, text
    assert not (tmp_path / "bad.png").exists()


@pytest.mark.parametrize(
    "name,layout,words",
    [
        ("phi3", ["--tp", "2"], "fuses Q, K, V with 2 KV heads"),
        ("llama", ["--tp", "8"], "tp=8 must divide the heads=4"),
        ("llama", ["--ep", "2", "--dp-shard", "2"], "ep=2 needs a model with experts"),
    ],
)
def test_a_transformers_model_a_layout_cannot_take_is_refused_before_any_rank(
    tmp_path, capsys, name, layout, words
):
    transformers = pytest.importorskip("transformers")
    kind = {"phi3": transformers.Phi3Config, "llama": transformers.LlamaConfig}[name]
    config = kind(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / name)
    argv = ["--init-from-hf", str(tmp_path / name), "--data", str(TEXT), "--seq-len", "16", *layout]
    assert words in _main_error(capsys, argv)


def _damage_weights(folder: Path, how: str) -> None:
    import safetensors.torch

    weights = folder / "model.safetensors"
    tensors = safetensors.torch.load_file(weights)
    if how == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif how == "no weights":
        weights.unlink()
    elif how == "a pickle only":  # a pytorch_model.bin whose unpickling would run code
        weights.unlink()
        (folder / "pytorch_model.bin").write_bytes(b"cos\nsystem\n(S'touch pwned'\ntR.")
    elif how in ("a tensor missing", "a tensor of another shape"):
        name = "model.norm.weight"
        if how == "a tensor missing":
            del tensors[name]
        else:
            tensors[name] = torch.zeros(tensors[name].numel() + 1)
        safetensors.torch.save_file(tensors, weights, metadata={"format": "pt"})
    elif how == "config not JSON":
        (folder / "config.json").write_text("{not json")
    elif how == "config of an encoder-decoder":
        transformers = pytest.importorskip("transformers")
        transformers.T5Config(d_model=32, num_layers=1, num_heads=4).save_pretrained(folder)
    elif how == "config of a masked LM":
        transformers = pytest.importorskip("transformers")
        config = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4)
        config.save_pretrained(folder)


@pytest.mark.parametrize(
    "how, words",
    [
        ("truncated", "its weights cannot be loaded (SafetensorError"),
        ("no weights", "no model.safetensors"),
        ("a pickle only", "only pytorch_model.bin, a pickle: never loaded"),
        ("a tensor missing", "its weights do not cover the model (missing ['model.norm.weight']"),
        ("a tensor of another shape", "other shapes ['model.norm.weight']"),
        ("config not JSON", "config.json is not usable (OSError"),
        ("config of an encoder-decoder", "its t5 config builds no causal LM"),
        ("config of a masked LM", "its bert config builds no causal LM"),
    ],
)
def test_an_init_from_hf_folder_that_cannot_be_loaded_is_refused_before_any_rank(
    tmp_path, capsys, monkeypatch, how, words
):
    """Every rank would load the folder with `from_pretrained`: the parent loads it first
    (safetensors only), so a damaged folder is one line, exit 2, and no world starts."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    folder = tmp_path / "hf"
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    _damage_weights(folder, how)
    monkeypatch.setattr(minidist, "launch", lambda *a, **k: pytest.fail("a world started"))
    monkeypatch.chdir(tmp_path)
    argv = ["--init-from-hf", str(folder), "--data", str(TEXT), "--seq-len", "16"]
    assert words in _main_error(capsys, argv)
    assert not (tmp_path / "pwned").exists()


def test_export_hf_never_touches_a_folder_it_did_not_create(tmp_path):
    """The export is staged in a folder of its own: a user's `.out.unfinished` (the name an
    earlier version staged in, and removed first) is left as it was."""
    from minidist.trainer.models import export_hf

    _, cfg, _ = prepare(parse(["--model", "llama"]))
    mine = tmp_path / ".out.unfinished"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    export_hf(build_model(cfg).state_dict(), cfg, str(tmp_path / "out"))
    assert (mine / "notes.txt").read_text() == "keep me"
    assert (tmp_path / "out" / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.unfinished", "out"]


def test_built_in_models_on_ignored_labels_take_the_global_valid_token_mean(tmp_path):
    """An .npz whose labels are -100 at uneven places in each row: the built-in models'
    loss is the mean over the global batch's valid targets, not each micro-batch's mean
    (that trained 2.1e-2 off one process on llama dp_shard 2 · pp 2 before); across
    micro-batches, data ranks, a pipeline, tp with sp and cp. Measured: losses ≤ 8.3e-7,
    parameters ≤ 2.6e-5 (lesson 17's tolerances). The count's all-reduce is planned."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 60, (64, 16)).astype(np.int64)
    labels = np.roll(ids, -1, 1)
    labels[rng.random((64, 16)) < 0.4] = -100
    labels[:32, :12] = -100  # some micro-batches hold far fewer valid targets than others
    np.savez(tmp_path / "pad.npz", input_ids=ids, labels=labels)
    data = ["--data", str(tmp_path / "pad.npz"), "--steps", "3"]
    argvs = [
        ["--model", "llama", "--dp-shard", "2", "--pp", "2", *data],
        ["--model", "gpt", "--cp", "2", "--tp", "2", "--sp", "--micro-batch", "2", *data],
        ["--model", "moe", "--dp-shard", "4", "--ep", "2", *data],
    ]
    ranks = minidist.launch(_runs, 4, argvs, timeout_s=600, idle_s=HUNG_S)
    for i, argv in enumerate(argvs):
        _close_to_one_process(ranks[0][i], argv)
        args = parse(argv)
        planned = _planned(args, check_run(args))["bytes"]
        for kind in ("dp", "tp", "pp", "cp"):  # the count's all-reduce among dp's
            assert max(r[i]["bytes"][kind] for r in ranks) == planned[kind], (argv, kind)
