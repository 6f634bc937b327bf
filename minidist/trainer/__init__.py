"""The trainer behind `python -m minidist train` (issue 35): what lessons 17 and 18 built,
with what a researcher's run needs around it.

- `options.py`: the options beyond the layout (model sizes, optimizer, data, evaluation,
  Hugging Face weights), `--config run.toml` with command-line overrides, the resolved
  configuration as TOML
- `data.py`: `--data` as rows of token ids (text through a byte-level or `tokenizers`
  tokenizer, nanoGPT's uint16 `.bin`, an `.npz` of `input_ids` and `labels`), a held-out
  split, read by global row so a resume on any layout continues the sequence
- `models.py`: the built-in models of any size, a `save_pretrained` folder through
  transformers' Auto classes, and the export of the trained weights as such a folder
- `loop.py`: `train_rank`, one rank's run top to bottom (build, parallelize, load, loop,
  evaluate, save, export); `reference`, the same run in one process
- `cli.py`: `python -m minidist train`, the checks in the parent, the `name=value` lines
- the optimizer (AdamW, the schedule, clipping by the global norm) is the engine's:
  `compose/optim.py`; the checkpoints are lesson 18's (`minidist.resilience`)

Anchors: nanoGPT's `train.py` (config with overrides, token files, warm-up and cosine
decay, clipping, evaluation, `init_from`), torchtitan (TOML, LR scheduler, `max_norm`, the
HF state-dict adapter).
"""
