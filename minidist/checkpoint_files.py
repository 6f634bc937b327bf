"""Checkpoint files as data: checksums, atomic directory swaps, errors that name the file.

Shared by both checkpoint formats (`minidist.fsdp.checkpoint`, `minidist.embedding.checkpoint`).
A checkpoint directory is complete when it holds `minidist.checksums.json`, written last by
rank 0 after every rank's files are on disk (write beside, fsync, rename). It records each
file's size and SHA-256 and, per format, each tensor's, so that a load verifies every byte it
is about to use and names the file or tensor that differs *before* anything changes: a
truncated, empty, missing or overwritten shard is a `CheckpointError`, an ordinary
`Exception` (`ValueError`), never a deep `EOFError` or DCP's `CheckpointException`, which is
a `BaseException`.

A save is written into `.<name>.unfinished` beside the checkpoint and put in place with two
renames (the old checkpoint to `.<name>.replaced`, the new one to `<name>`), the scheme of
write-ahead atomic replacement (POSIX `rename(2)` is atomic within a file system). A process
killed between the two renames leaves `<name>` missing, a complete `.unfinished` (its
checksums file present) and the old one in `.replaced`: `recover` finishes the swap, so the
next load or save finds the new checkpoint where it belongs. The saving rank 0 holds its
staging folder locked (`Staging`: an `flock`, which the kernel drops when the holder dies)
from its creation until the swap is done, so that `recover` never finishes the swap of a
save that is alive (a reader doing so made that save fail), and a second save to the same
path (another world) is refused while the first runs instead of sharing its folder. The two
renames are made under the folder's lock, under which a reader decides that there is no
checkpoint (`absent`): one that found `<name>` missing between them reads it after. Loads
read through `minidist.checkpoint_pin`, which holds one version's files open. A checksum
guards against corruption, not against an attacker who can rewrite the checksums too: what
keeps a crafted file from running code is that loads never unpickle anything but plain data
(see each format's module).

A run that keeps its last N saves (`train --keep-last N`) writes each into
`DIR/step_<8 digits>` by the same scheme; `newest(DIR)` is the one a resume loads (a
half-written one, without its checksums file, is passed over) and `keep_last(DIR, N)` removes
the older complete `step_<digits>` folders, and nothing else in DIR.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import warnings
from pathlib import Path

import torch

CHECKSUMS = "minidist.checksums.json"
UNFINISHED, REPLACED = ".unfinished", ".replaced"
_BLOCK = 1 << 20


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as it is; the message names the file and the fault."""


# -- checksums -----------------------------------------------------------------------------------
def sha256_file(path: Path, start: int = 0, length: int | None = None) -> str:
    """SHA-256 of `length` bytes of `path` from `start` (to the end when None)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(start)
        left = length
        while left is None or left > 0:
            block = f.read(_BLOCK if left is None else min(_BLOCK, left))
            if not block:
                break
            h.update(block)
            left = None if left is None else left - len(block)
    return h.hexdigest()


def sha256_tensor(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's bytes in row-major order (any dtype, any device)."""
    flat = t.detach().reshape(-1).contiguous().cpu()
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()


def file_record(path: Path) -> dict:
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


# -- small files written atomically ---------------------------------------------------------------
def write_json(path: Path, record: dict) -> None:
    """Write `record` to `path` atomically: beside it, fsync, rename, fsync the directory."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_json(path: Path) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path} cannot be read as JSON ({e})") from e


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- the directory swap ---------------------------------------------------------------------------
def unfinished_path(path: Path) -> Path:
    return path.with_name(f".{path.name}{UNFINISHED}")


def replaced_path(path: Path) -> Path:
    return path.with_name(f".{path.name}{REPLACED}")


def is_complete(directory: Path) -> bool:
    return (directory / CHECKSUMS).is_file()


def _rename(src: Path, dst: Path) -> None:
    os.rename(src, dst)


def _lock(fd: int) -> bool:
    """Take the exclusive `flock` of `fd` without waiting; False when a live process holds it
    (the kernel drops a lock when its holder dies, so a killed save never holds one)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class _DirLock:
    """`with _DirLock(directory):` the exclusive `flock` of a directory, waiting for it."""

    def __init__(self, directory: Path):
        self.fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)

    def __enter__(self):
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # releases the lock


def _held(directory: Path) -> bool:
    """True when a live save holds `directory` (its staging folder) locked."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        return not _lock(fd)
    finally:
        os.close(fd)


class Staging:
    """The staging folder `.<name>.unfinished` of one save, held locked (an `flock` on the
    folder) from its creation until the save is in place or has failed: another save to the
    same path is refused while it is held, and a reader never finishes a swap a live save is
    making (`recover`)."""

    def __init__(self, path: Path, who: str = "save"):
        self.path, self.folder = path, unfinished_path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with _DirLock(path.parent):  # one claim at a time in this folder
            if self.folder.exists() and _held(self.folder):
                raise CheckpointError(
                    f"{who}: another save to {path} is running ({self.folder.name} is held by a "
                    "live process): two worlds must not save to one path at once"
                )
            _recover(path)  # a complete save stopped between its renames is not thrown away
            shutil.rmtree(self.folder, ignore_errors=True)  # what an interrupted save left
            self.folder.mkdir()
            self.fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY)
            _lock(self.fd)  # nobody else can hold a folder made under the parent's lock

    def put_in_place(self) -> None:
        """Replace `path` by the complete staging folder (an earlier checkpoint goes only now)."""
        put_in_place(self.folder, self.path)

    def release(self) -> None:
        """Unlock; a staging folder still empty (the save failed before writing) goes."""
        if self.fd is not None:
            try:
                self.folder.rmdir()  # only when empty: partial files stay for inspection
            except OSError:
                pass
            os.close(self.fd)
            self.fd = None


def put_in_place(unfinished: Path, path: Path) -> None:
    """Replace `path` by the complete `unfinished` (an earlier checkpoint goes only now)."""
    replaced = replaced_path(path)
    shutil.rmtree(replaced, ignore_errors=True)
    with _DirLock(path.parent):  # a reader deciding "no checkpoint" (`absent`) waits
        if path.exists():
            _rename(path, replaced)
        _rename(unfinished, path)
    shutil.rmtree(replaced, ignore_errors=True)  # a reader holding its files still reads them
    fsync_dir(path.parent)


def _recover(path: Path) -> bool:
    unfinished = unfinished_path(path)
    if path.exists() or not is_complete(unfinished) or _held(unfinished):
        return False  # in place, never completed, or a live save is between its renames
    try:
        _rename(unfinished, path)
    except OSError:
        if not path.exists():
            raise
        return False
    shutil.rmtree(replaced_path(path), ignore_errors=True)
    fsync_dir(path.parent)
    warnings.warn(
        f"{path} was missing: a save completed but was stopped between its two renames; "
        f"its complete copy {unfinished.name} is now {path.name}",
        RuntimeWarning,
        stacklevel=4,
    )
    return True


def recover(path: Path) -> bool:
    """Finish a swap that was interrupted between its two renames; True when it did.

    Only when `path` is missing, `.<name>.unfinished` is complete (its checksums file is
    written after every rank's files) and no live save holds it (a save between its two
    renames is left to finish). Safe when several processes call it at once: the rename
    happens once, the others find `path` in place.
    """
    if path.exists() or not path.parent.is_dir():
        return False
    with _DirLock(path.parent):
        return _recover(path)


def absent(path: Path) -> bool:
    """True when there is no checkpoint at `path` and none is being put there: decided under
    the folder's lock, which a save holds across its two renames (`put_in_place`), so that a
    swap that ended after a reader found `path` missing is seen (the reader opens it again)
    instead of being reported as no checkpoint."""
    if not path.parent.is_dir():
        return True
    with _DirLock(path.parent):
        return not path.exists() and not is_complete(unfinished_path(path))


def swapping(path: Path) -> bool:
    """True while a live save is between its two renames (`path` missing for a moment)."""
    unfinished = unfinished_path(path)
    return not path.exists() and is_complete(unfinished) and _held(unfinished)


# -- the last N of a run's saves (`train --keep-last N`) ------------------------------------------
_STEP = re.compile(r"step_(\d+)")


def step_path(directory: str | os.PathLike, step: int) -> Path:
    """Where a run keeping its last saves puts step `step`'s: `directory/step_<8 digits>`."""
    return Path(directory) / f"step_{step:08d}"


def step_checkpoints(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, folder) of each complete `step_<digits>` checkpoint in `directory`, oldest first
    (a folder, not a link, holding its checksums file; anything else is not one)."""
    directory, found = Path(directory), []
    if directory.is_dir():
        for child in directory.iterdir():
            m = _STEP.fullmatch(child.name)
            if m and not child.is_symlink() and child.is_dir() and is_complete(child):
                found.append((int(m.group(1)), child))
    return sorted(found)


def newest(directory: str | os.PathLike, finish: bool = False) -> Path | None:
    """The checkpoint a resume from `directory` loads: the folder itself when complete, else
    its newest complete `step_<digits>` checkpoint (a half-written one is passed over), else
    None. `finish`: first finish the swaps stopped between their renames (`recover`)."""
    directory = Path(directory)
    if finish:
        recover(directory)
        if directory.is_dir():
            for child in directory.iterdir():
                m = re.fullmatch(rf"\.(step_\d+){re.escape(UNFINISHED)}", child.name)
                if m:
                    recover(directory / m.group(1))
    if is_complete(directory):
        return directory
    steps = step_checkpoints(directory)
    return steps[-1][1] if steps else None


def keep_last(directory: str | os.PathLike, n: int) -> list[Path]:
    """Remove all but the newest `n` complete `step_<digits>` checkpoints of `directory` (and
    what an earlier removal killed midway left, `.step_<digits>.replaced`); nothing else is
    touched. Each goes by a rename first, so a removal killed midway never leaves a
    `step_<digits>` folder that looks complete. Returns the folders removed."""
    if n < 1:
        raise ValueError(f"keep_last: n={n} must be >= 1")
    directory, removed = Path(directory), []
    with _DirLock(directory):  # not while a save claims its staging folder or a swap recovers
        for child in directory.iterdir():
            if re.fullmatch(rf"\.step_\d+{re.escape(REPLACED)}", child.name) and not (
                child.is_symlink()
            ):
                shutil.rmtree(child, ignore_errors=True)
        for _, folder in step_checkpoints(directory)[:-n]:
            gone = replaced_path(folder)
            _rename(folder, gone)
            shutil.rmtree(gone, ignore_errors=True)  # a reader holding its files still reads them
            removed.append(folder)
    if removed:
        fsync_dir(directory)
    return removed
