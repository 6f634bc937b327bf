"""The trainer's data (`--data PATH`): rows of (input, target) token ids, read by global row.

- a **text** file, or a folder of them (every file under it but hidden ones, in path
  order, concatenated):
  tokenized at run time by a byte-level tokenizer (UTF-8 bytes, ids 0-255: nothing to
  download), or by a `tokenizers` JSON file given with `--tokenizer`;
- a **token file** `.bin`: a flat array of uint16 ids (nanoGPT's `prepare.py` format), read
  through a memory map;
- an **`.npz`** with `input_ids` and `labels`, int64 [N, seq], labels as Hugging Face's
  (`labels[t]` is the token at t, predicted from position t − 1: shifted here, the last
  position's target -100; -100 is ignored by the loss).

A token stream (text or `.bin`) is cut into rows of seq + 1 tokens overlapping by one (row r
is tokens r·seq … r·seq + seq: the input its first seq, the target its last seq) and read in
one random order fixed by `--seed` (`shuffle`), epoch after epoch, as nanoGPT samples
random windows. An `.npz`'s rows are read once, in order: step i trains on rows
i·B … (i+1)·B − 1 (B the global batch), so it must hold steps·B of them. With `--eval-every`
the last `eval_batches`·B rows are the held-out split, never trained on.

`batch(i, rows)` returns the given rows of global batch i only (each data rank reads its
own); the position in the data is the global sample index (`TrainingState.samples`), so a
resume on any layout continues with the next batch. `identity()` names the data for the
checkpoint (a resume on other data is refused).
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import numpy as np
import torch

IGNORE = -100


class TokenData:
    """Global batches of rows of `seq_len` (input, target) ids: see the module."""

    def __init__(
        self, rows_fn, n_rows: int, seq_len: int, vocab: int, max_id: int, what: dict, cycle: bool
    ):
        self._rows, self.n_rows, self.seq_len = rows_fn, n_rows, seq_len
        self.vocab, self.max_id, self.what, self.cycle = vocab, max_id, what, cycle
        self.n_eval, self.order = 0, None

    @property
    def ignores(self) -> bool:
        """Whether targets may be -100 (an .npz's labels; its rows' last target always is),
        so the loss must be the mean over the global batch's valid tokens."""
        return self.what.get("kind") == "npz"

    def split(self, global_batch: int, eval_batches: int) -> None:
        """Hold out the last `eval_batches`·`global_batch` rows for evaluation."""
        self.global_batch, self.n_eval = global_batch, eval_batches * global_batch

    def shuffle(self, seed: int) -> None:
        """Read the training rows in one fixed random order (seeded; the same every epoch),
        after `split`: a token stream's neighbouring rows are one file's neighbouring lines."""
        self.order = np.random.default_rng(seed).permutation(self.n_train)
        self.what = {**self.what, "shuffle_seed": seed}

    @property
    def n_train(self) -> int:
        return self.n_rows - self.n_eval

    def check(self, steps: int, global_batch: int) -> None:
        """ValueError naming the option when the data cannot feed the run."""
        if self.n_train < global_batch:
            held = " after the held-out split" if self.n_eval else ""
            raise ValueError(
                f"--data {self.what['path']}: {self.n_train} training rows of --seq-len="
                f"{self.seq_len}{held}, fewer than --global-batch={global_batch}"
            )
        if not self.cycle and self.n_train < steps * global_batch:
            raise ValueError(
                f"--data {self.what['path']}: {self.n_train} training rows, fewer than "
                f"--steps·--global-batch = {steps * global_batch} (an .npz is read once)"
            )

    def batch(self, i: int, rows: range, global_batch: int):
        """Rows `rows` (of 0..B-1) of training batch i: (input, target), int64 [len, seq]."""
        first = i * global_batch
        picked = [(first + r) % self.n_train for r in rows]
        return self._rows(picked if self.order is None else self.order[picked].tolist())

    def eval_batch(self, j: int, rows: range, global_batch: int):
        """Rows `rows` of held-out batch j."""
        first = self.n_train + j * global_batch
        return self._rows([first + r for r in rows])

    def identity(self) -> dict:
        return dict(self.what)


def _digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).view(np.uint8).reshape(-1).data)
    return h.hexdigest()[:16]


def _stream(tokens: np.ndarray, seq_len: int, what: dict) -> TokenData:
    n_rows = max(0, (len(tokens) - 1) // seq_len)

    def rows(indices: list[int]):
        x = np.stack([tokens[r * seq_len : r * seq_len + seq_len] for r in indices])
        y = np.stack([tokens[r * seq_len + 1 : r * seq_len + seq_len + 1] for r in indices])
        return (torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64)))

    max_id = int(tokens.max()) if len(tokens) else -1
    return TokenData(rows, n_rows, seq_len, max_id + 1, max_id, what, cycle=True)


def _text_files(path: Path) -> list[Path]:
    """`path`, or the files under folder `path` in path order, hidden ones (.git/) left out."""
    if not path.is_dir():
        return [path]
    files = sorted(p for p in path.rglob("*") if p.is_file())
    return [p for p in files if not any(s.startswith(".") for s in p.relative_to(path).parts)]


def _tokenize(path: Path, tokenizer: str | None) -> tuple[np.ndarray, int, str]:
    files = _text_files(path)
    if tokenizer is None:
        data = b"".join(f.read_bytes() for f in files)
        return np.frombuffer(data, dtype=np.uint8).astype(np.int64), 256, "bytes"
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(tokenizer)
    except Exception as e:  # the Rust library's own exception: not valid JSON, not a tokenizer
        raise ValueError(
            f"--tokenizer {tokenizer}: not a tokenizers JSON file ({str(e).splitlines()[0]})"
        ) from None
    ids = [i for f in files for i in tok.encode(f.read_text(errors="replace")).ids]
    return np.asarray(ids, dtype=np.int64), tok.get_vocab_size(), f"tokenizers:{tokenizer}"


def _npz_arrays(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """input_ids and labels of the .npz at `path`, read as plain arrays (never a pickle)."""
    try:
        f = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise ValueError(f"--data {path}: not an .npz archive ({str(e).splitlines()[0]})") from None
    if not isinstance(f, np.lib.npyio.NpzFile):
        raise ValueError(f"--data {path}: an .npy array, not an .npz archive of arrays")
    with f:
        if "input_ids" not in f or "labels" not in f:
            raise ValueError(
                f"--data {path}: an .npz needs arrays input_ids and labels, has {sorted(f.keys())}"
            )
        try:
            return f["input_ids"], f["labels"]
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:  # object arrays
            raise ValueError(
                f"--data {path}: input_ids and labels must be plain integer arrays "
                f"({str(e).splitlines()[0]})"
            ) from None


def _npz(path: Path, seq_len: int | None) -> TokenData:
    ids, labels = _npz_arrays(path)
    if ids.ndim != 2 or ids.shape != labels.shape or ids.dtype.kind not in "iu":
        raise ValueError(
            f"--data {path}: input_ids and labels must be integer arrays of one shape "
            f"[N, seq], got {ids.shape} {ids.dtype} and {labels.shape}"
        )
    if ids.shape[1] < 2:
        raise ValueError(
            f"--data {path}: rows of {ids.shape[1]} tokens: a row needs >= 2 (the last "
            "position has no target)"
        )
    if seq_len is not None and seq_len != ids.shape[1]:
        raise ValueError(f"--seq-len={seq_len}: the .npz rows have {ids.shape[1]} tokens")
    ids, labels = ids.astype(np.int64), labels.astype(np.int64)
    if ids.min(initial=0) < 0 or (labels[labels != IGNORE].min(initial=0) < 0):
        raise ValueError(f"--data {path}: token ids must be >= 0 (labels: or -100)")
    targets = np.concatenate([labels[:, 1:], np.full_like(labels[:, :1], IGNORE)], axis=1)

    def rows(indices: list[int]):
        return torch.from_numpy(ids[indices]), torch.from_numpy(targets[indices])

    max_id = int(max(ids.max(initial=0), labels.max(initial=0)))
    what = {
        "path": str(path),
        "kind": "npz",
        "rows": int(ids.shape[0]),
        "sha256": _digest(ids, labels),
    }
    return TokenData(rows, ids.shape[0], ids.shape[1], max_id + 1, max_id, what, cycle=False)


def load_data(path: str, seq_len: int | None, tokenizer: str | None = None) -> TokenData:
    """The data at `path` (see the module); ValueError naming the option when unusable."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"--data {path}: no such file or folder")
    if not (p.is_file() or p.is_dir()):  # a FIFO would block, /dev/zero never end
        raise ValueError(f"--data {path}: not a regular file or folder")
    if tokenizer is not None and not Path(tokenizer).is_file():
        raise ValueError(f"--tokenizer {tokenizer}: no such file")
    if p.suffix == ".npz":
        return _npz(p, seq_len)
    seq_len = seq_len or 16  # lesson 17's
    if p.suffix == ".bin":
        size = p.stat().st_size
        if size == 0 or size % 2:
            raise ValueError(
                f"--data {path}: {size} bytes, not a token file of uint16 ids "
                "(a positive, even number of bytes)"
            )
        tokens = np.memmap(p, dtype=np.uint16, mode="r")
        vocab, kind = None, "bin-uint16"
        what = {"path": str(p), "kind": kind, "tokens": len(tokens), "sha256": _digest(tokens)}
    else:
        tokens, vocab, kind = _tokenize(p, tokenizer)
        what = {"path": str(p), "kind": kind, "tokens": len(tokens), "sha256": _digest(tokens)}
    if len(tokens) == 0:
        raise ValueError(f"--data {path}: empty (no tokens)")
    if len(tokens) < seq_len + 1:
        raise ValueError(
            f"--seq-len={seq_len} is longer than the data ({len(tokens)} tokens "
            f"in {path}: a row needs seq_len + 1)"
        )
    data = _stream(tokens, seq_len, what)
    if vocab is not None:
        data.vocab = max(vocab, data.vocab)
    return data


def course_data(
    steps: int, global_batch: int, seq_len: int, seed: int, eval_batches: int = 0
) -> TokenData:
    """Lesson 17's data (no `--data`): the course's generated corpus, character ids, windows
    at random offsets (`data.lm_batches`, the same batches as `compose.fixture.build`)."""
    from ..data import CharTokenizer, lm_batches, make_corpus

    text = make_corpus(200, seed=seed)
    tok = CharTokenizer(text)
    batches = lm_batches(tok.encode(text), steps + eval_batches, global_batch, seq_len, seed=seed)
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    what = {"path": "(the course corpus)", "kind": "course", "seed": seed}
    data = TokenData(
        lambda rows: (x[rows], y[rows]),
        x.shape[0],
        seq_len,
        tok.vocab_size,
        tok.vocab_size - 1,
        what,
        cycle=False,
    )
    return data
