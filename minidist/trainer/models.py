"""The trainer's model: a built-in of any size, or a Hugging Face folder; and its export.

- `--model gpt|moe|llama` with `--hidden --heads --kv-heads --layers --seq-len --vocab
  --ffn`: the course GPT (MLP 4·hidden, no grouped-query attention), its MoE form (4
  experts, top-1, no token dropped) or the Llama-style model (`models_llama`, Hugging Face's
  names). Defaults are lesson 17's (hidden 32, 4 heads, 2 KV heads for llama, 4 layers, 16
  tokens, llama's ffn 2·hidden); the vocabulary is the data's, padded to a multiple of 8.
  A `--vocab` tp does not divide is padded inside the engine (the embedding's and the head's
  rows to a multiple of tp, the padding masked out of the softmax: `megatron.layers`); the
  whole parameters, checkpoints and exports keep its `--vocab` rows.
- `--init-from-hf DIR`: a `save_pretrained` folder, built with transformers' Auto classes
  (`AutoModelForCausalLM.from_pretrained`, float32), its sizes from its config.json.
- `export_hf(state, config, out)`: the trained whole tensors (parameters and persistent
  buffers) as a folder `from_pretrained` loads (config.json + model.safetensors): the
  Hugging Face model's own class, or for the built-in llama `transformers.LlamaForCausalLM`
  (the same names and numerics). The course GPT has no Hugging Face class here: refused.

`model_config(args, data)` resolves the sizes and refuses a bad combination with a
ValueError naming the option and the rule; `build_model(config, seed)` builds it, the same
on every rank.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
import torch.nn as nn

DEFAULTS = dict(hidden=32, heads=4, layers=4, seq_len=16)  # compose.fixture.SIZES
SIZE_OPTIONS = ("hidden", "heads", "kv_heads", "layers", "ffn", "vocab")


def _opt(name: str) -> str:
    return "--" + name.replace("_", "-")


def model_config(args, data) -> dict:
    """The run's model as a flat dict (saved in the checkpoint's record, compared on resume)."""
    if args.init_from_hf:
        return _hf_config(args, data)
    if ":" in args.model:
        return _factory_config(args, data)
    get = lambda name: getattr(args, name, None)  # noqa: E731
    cfg = {"model": args.model, "seq_len": data.seq_len}
    for name in ("hidden", "heads", "layers"):
        cfg[name] = get(name) or DEFAULTS[name]
    h, n = cfg["hidden"], cfg["heads"]
    if h % n:
        raise ValueError(f"--heads={n} must divide --hidden={h}")
    if args.model == "llama":
        cfg["kv_heads"] = get("kv_heads") or (n // 2 if n % 2 == 0 else n)
        cfg["ffn"] = get("ffn") or 2 * h
        if n % cfg["kv_heads"]:
            raise ValueError(f"--kv-heads={cfg['kv_heads']} must divide --heads={n}")
        if (h // n) % 2:
            raise ValueError(f"--hidden/--heads = {h // n} must be even (rotary rotates pairs)")
    else:
        if get("kv_heads") not in (None, n):
            raise ValueError(
                f"--kv-heads={get('kv_heads')}: the {args.model} model has no grouped-query "
                "attention (every head its own K/V; use --model llama)"
            )
        if get("ffn") not in (None, 4 * h):
            raise ValueError(
                f"--ffn={get('ffn')}: the {args.model} model's MLP is 4·--hidden = "
                f"{4 * h} (use --model llama for another width)"
            )
    cfg["vocab"] = get("vocab") or -(-data.vocab // 8) * 8
    if cfg["vocab"] <= data.max_id:
        raise ValueError(
            f"--vocab={cfg['vocab']} must exceed the data's largest token id {data.max_id}"
        )
    return cfg


def _hf_config(args, data) -> dict:
    from transformers import AutoConfig

    from ..model_parts import hf_sizes

    for name in SIZE_OPTIONS:
        if getattr(args, name, None) is not None:
            raise ValueError(
                f"{_opt(name)}: the model's sizes come from --init-from-hf "
                f"{args.init_from_hf}'s config.json"
            )
    path = Path(args.init_from_hf)
    if not (path / "config.json").is_file():
        raise ValueError(f"--init-from-hf {path}: no config.json (a save_pretrained folder)")
    try:  # trust_remote_code stays off: a config.json's auto_map is refused, never imported
        config = AutoConfig.from_pretrained(path)
        vocab = config.vocab_size
    except Exception as e:  # not JSON, an unknown model_type, remote code, no vocab_size
        raise ValueError(
            f"--init-from-hf {path}: config.json is not usable ({_first(e)})"
        ) from None
    if vocab <= data.max_id:
        raise ValueError(
            f"--init-from-hf {path}: its vocab_size={vocab} must exceed the "
            f"data's largest token id {data.max_id}"
        )
    return {
        "model": "hf",
        "path": str(path.resolve()),
        "model_type": config.model_type,
        "vocab": vocab,
        "seq_len": data.seq_len,
        "hidden": config.hidden_size,
        "heads": config.num_attention_heads,
        "layers": config.num_hidden_layers,
        "experts": hf_sizes(config)["experts"],
    }


def factory(name: str):
    """The function `package.module:function` names (imported: the user's own code)."""
    import importlib

    module, _, function = name.partition(":")
    try:
        fn = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"--model {name}: cannot import it ({e})") from None
    if not callable(fn):
        raise ValueError(f"--model {name}: {function} is not a function")
    return fn


def _factory_config(args, data) -> dict:
    """`--model package.module:function`: a function of no arguments returning a
    transformers causal LM (its sizes are its config's)."""
    from ..model_parts import hf_sizes, is_hf

    for name in SIZE_OPTIONS:
        if getattr(args, name, None) is not None:
            raise ValueError(f"{_opt(name)}: the model's sizes come from --model {args.model}")
    torch.manual_seed(args.seed)
    model = factory(args.model)()
    if not is_hf(model):
        kind = type(model).__name__
        raise ValueError(
            f"--model {args.model} returned a {kind}: a factory must return a "
            "transformers causal LM (its forward runs untouched)"
        )
    sizes = hf_sizes(model.config)
    if sizes["vocab"] <= data.max_id:
        raise ValueError(
            f"--model {args.model}: its vocab_size={sizes['vocab']} must exceed "
            f"the data's largest token id {data.max_id}"
        )
    return {
        "model": "factory",
        "factory": args.model,
        "model_type": model.config.model_type,
        "vocab": sizes["vocab"],
        "seq_len": data.seq_len,
        "hidden": sizes["hidden"],
        "heads": sizes["heads"],
        "layers": sizes["layers"],
        "experts": sizes["experts"],
    }


def build_model(cfg: dict, seed: int = 0) -> nn.Module:
    """The model of `cfg` (from `model_config`) on the CPU, float32, seeded with `seed`."""
    from ..expert_parallel.gpt import moe_gpt
    from ..models import GPT, GPTConfig
    from ..models_llama import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    if cfg["model"] == "factory":
        return factory(cfg["factory"])().float()
    if cfg["model"] == "hf":
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging

        logging.disable_progress_bar()  # the progress line is the trainer's
        return AutoModelForCausalLM.from_pretrained(
            cfg["path"], dtype=torch.float32, use_safetensors=True
        )
    sizes = dict(
        vocab_size=cfg["vocab"],
        seq_len=cfg["seq_len"],
        layers=cfg["layers"],
        heads=cfg["heads"],
        hidden=cfg["hidden"],
    )
    if cfg["model"] == "llama":
        return LlamaForCausalLM(LlamaConfig(kv_heads=cfg["kv_heads"], ffn=cfg["ffn"], **sizes))
    if cfg["model"] == "moe":
        return moe_gpt(GPTConfig(**sizes), experts=4, k=1, capacity_factor=4.0, seed=seed)
    return GPT(GPTConfig(**sizes))


def _first(e: BaseException) -> str:
    """An exception's type and first line of text (transformers' run to pages)."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


def hf_skeleton(cfg: dict) -> nn.Module:
    """`skeleton(cfg)`, or a ValueError naming --init-from-hf when transformers builds no
    causal LM of its config (T5's, an encoder's) or finds none of its parts."""
    from ..model_parts import find_parts

    try:
        model = skeleton(cfg)
        find_parts(model)
    except Exception as e:
        raise ValueError(
            f"--init-from-hf {cfg['path']}: its {cfg['model_type']} config builds no causal LM "
            f"with a layer list and a head here ({_first(e)})"
        ) from None
    return model


def check_hf_weights(model: nn.Module, path: str) -> None:
    """--init-from-hf's weights, read in the parent as every rank will (`build_model`): the
    safetensors files only (a `pytorch_model.bin` is a pickle: never loaded), every tensor
    of the model present with its shape, the files whole."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    folder = Path(path)
    if not any(folder.glob("*.safetensors")):
        pickles = sorted(p.name for p in folder.glob("*.bin"))
        raise ValueError(
            f"--init-from-hf {path}: no model.safetensors"
            + (
                f" (only {pickles[0]}, a pickle: never loaded; save it as safetensors)"
                if pickles
                else ""
            )
        )
    logging.disable_progress_bar()
    try:
        _, info = AutoModelForCausalLM.from_pretrained(
            path,
            dtype=torch.float32,
            use_safetensors=True,
            output_loading_info=True,
            ignore_mismatched_sizes=True,  # reported below, by name
        )
    except Exception as e:  # a truncated file, a tensor of another shape
        raise ValueError(
            f"--init-from-hf {path}: its weights cannot be loaded ({_first(e)})"
        ) from None
    missing = sorted(info.get("missing_keys") or ())
    mismatched = sorted(
        str(k[0] if isinstance(k, tuple) else k) for k in info.get("mismatched_keys") or ()
    )
    if missing or mismatched:
        raise ValueError(
            f"--init-from-hf {path}: its weights do not cover the model (missing {missing[:3]}"
            f"{', ...' if len(missing) > 3 else ''}, other shapes {mismatched[:3]}): they would "
            "be initialised at random"
        )


def skeleton(cfg: dict) -> nn.Module:
    """The transformers model of `cfg` (an --init-from-hf folder) on the meta device: its
    structure and config, no weights read or allocated."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(cfg["path"]))


def check_export(cfg: dict, out: str, save: str | None = None) -> None:
    """ValueError when `--export-hf out` cannot be written for this model (before training):
    a folder that can be made, apart from the checkpoint folder `save`."""
    from ..cli_checks import writable_folder

    if cfg["model"] in ("gpt", "moe"):
        raise ValueError(
            f"--export-hf: the built-in {cfg['model']} has no Hugging Face class "
            "here (export --model llama, or a model from --init-from-hf)"
        )
    path = Path(out)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ValueError(
            f"--export-hf {out}: exists and is not an empty folder (never overwritten)"
        )
    if why := writable_folder(path):
        raise ValueError(f"--export-hf {out}: {why}")
    if save is not None:
        a, b = path.resolve(), Path(save).resolve()
        if a == b or b in a.parents or a in b.parents:
            raise ValueError(
                f"--export-hf {out}: overlaps --save {save} (the checkpoint's folder): "
                "export into another folder"
            )


def hf_model(cfg: dict) -> nn.Module:
    """An untrained Hugging Face model of `cfg`'s class and sizes (to load weights into)."""
    if cfg["model"] == "factory":
        return factory(cfg["factory"])().float()
    if cfg["model"] == "hf":
        from transformers import AutoConfig, AutoModelForCausalLM

        return AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(cfg["path"]), dtype=torch.float32
        )
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=cfg["vocab"],
        hidden_size=cfg["hidden"],
        intermediate_size=cfg["ffn"],
        num_hidden_layers=cfg["layers"],
        num_attention_heads=cfg["heads"],
        num_key_value_heads=cfg["kv_heads"],
        head_dim=cfg["hidden"] // cfg["heads"],
        max_position_embeddings=cfg["seq_len"],
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
    )  # rope_theta: both default to 10000
    return LlamaForCausalLM(config)


def export_hf(state: dict[str, torch.Tensor], cfg: dict, out: str) -> Path:
    """Write `state` (whole tensors, one-process names: the parameters and the persistent
    buffers, e.g. DeepSeek-V3's trained routing bias) as a `from_pretrained` folder at `out`,
    atomically (a hidden `.unfinished` folder renamed into place)."""
    check_export(cfg, out)
    from transformers.utils import logging

    logging.disable_progress_bar()
    model = hf_model(cfg)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {n for n in missing if n == "lm_head.weight" and model.config.tie_word_embeddings}
    if set(missing) - tied or unexpected:
        raise ValueError(
            f"--export-hf: the trained weights do not fit {type(model).__name__}: "
            f"missing {sorted(set(missing) - tied)[:4]}, unexpected "
            f"{sorted(unexpected)[:4]}"
        )
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a staging folder of this export's own (never a name another run or the user holds)
    unfinished = Path(
        tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".unfinished", dir=path.parent)
    )
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(unfinished, 0o777 & ~umask)  # mkdtemp's is 0700: the folder as mkdir makes it
    try:
        model.save_pretrained(unfinished)
        os.replace(unfinished, path)  # onto a missing or empty folder only (check_export)
    except OSError as e:
        shutil.rmtree(unfinished, ignore_errors=True)
        raise ValueError(f"--export-hf {out}: not written ({e})") from e
    return path
