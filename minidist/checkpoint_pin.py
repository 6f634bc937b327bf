"""Reading one whole version of a checkpoint while saves replace it: the files held open.

Shared by both checkpoint formats, beside `minidist.checkpoint_files` (which writes and
swaps). A save never changes a complete checkpoint's files; it renames a whole new
directory over the old one and then deletes the old (`checkpoint_files.put_in_place`). A
load that checked the checksums and then reopened the files by name could read the next
version's shards after its check (a read during a save returned a mix of two versions).
So a load *pins* a version first (`pin`): it opens the checkpoint directory, then the
checksums file and every file that file lists *through that directory's descriptor*
(`openat`), and reads, checks and loads only through those descriptors. An open file keeps
its bytes after a save renames or deletes it (POSIX `unlink`: the data lives until the last
descriptor closes), so the checks and the load see the same bytes, all of one version. When
a save removed the directory while it was being opened (a listed file vanished and the path
now names another directory), the pin starts again; while a save is between its two renames
(the path missing for a moment, its staging folder complete and locked) it waits. "No
checkpoint" is said only under the folder's lock, which a save holds across its two renames
(`checkpoint_files.absent`): a reader whose open failed between the renames, and whose look
at the save came after the second one, saw the path missing and no swap under way, and
reported the new checkpoint missing, pointing at the old one's `.replaced` name.

Ranks loading one sharded checkpoint together agree on the version (`same_everywhere`):
each pins, the checksums files' digests are gathered, and all pin again while they differ.
A save tells every rank the same error (`raise_everywhere`), never one rank alone.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import stat
import time
from pathlib import Path

import torch.distributed as dist

from . import comm
from .checkpoint_files import _BLOCK, CHECKSUMS, CheckpointError, absent, recover, swapping

ATTEMPTS = 1000  # pins started again before giving up (a save every millisecond)


class Pinned:
    """One version of a checkpoint: its checksums record and every listed file, held open."""

    def __init__(self, path: Path, record: dict, digest: str, fds: dict[str, int]):
        self.path, self.record, self.digest, self.fds = path, record, digest, fds

    def size(self, name: str) -> int:
        return os.fstat(self._fd(name)).st_size

    def read(self, name: str, start: int = 0, length: int | None = None) -> bytes:
        """`length` bytes of `name` from `start` (to the end when None), from the held file."""
        fd, out = self._fd(name), []
        end = self.size(name) if length is None else start + length
        while start < end:
            block = os.pread(fd, min(_BLOCK, end - start), start)
            if not block:
                break
            out.append(block)
            start += len(block)
        return b"".join(out)

    def sha256(self, name: str, start: int = 0, length: int | None = None) -> str:
        return hashlib.sha256(self.read(name, start, length)).hexdigest()

    def check(self, name: str, record: dict) -> None:
        """Raise `CheckpointError` unless `name` has the recorded size (and SHA-256)."""
        where = self.path / name
        size = self.size(name)
        if size != record["bytes"]:
            what = "empty" if size == 0 else "truncated" if size < record["bytes"] else "longer"
            raise CheckpointError(
                f"{where} is {what}: {size} bytes, the checkpoint recorded {record['bytes']}"
            )
        if "sha256" in record and self.sha256(name) != record["sha256"]:
            raise CheckpointError(f"{where}: its bytes differ from the checksum recorded at save")

    def open(self, name: str) -> io.BufferedReader:
        """A file object of the held file `name` (its own descriptor, position 0)."""
        f = os.fdopen(os.dup(self._fd(name)), "rb")
        f.seek(0)
        return f

    def _fd(self, name: str) -> int:
        if name not in self.fds:
            raise CheckpointError(
                f"{self.path}: {name!r} is not among the files its {CHECKSUMS} lists"
            )
        return self.fds[name]

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _same(dfd: int, path: Path) -> bool:
    """True while `path` still names the directory open as `dfd`."""
    try:
        now = os.stat(path)
    except OSError:
        return False
    then = os.fstat(dfd)
    return (now.st_dev, now.st_ino) == (then.st_dev, then.st_ino)


def _open_in(dfd: int, path: Path, name: str) -> int:
    """`name` inside the directory `dfd`, a regular file (never waiting on a FIFO)."""
    if not name or "/" in name or name in (".", ".."):
        raise CheckpointError(f"{path}: {CHECKSUMS} lists {name!r}, which is no file name")
    try:  # O_NOFOLLOW: a link inside the checkpoint (to /etc/passwd, to another run's file)
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW, dir_fd=dfd)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise CheckpointError(
            f"{path / name} is not a regular file (a symbolic link: a checkpoint's files are "
            "its own, never read through a link)"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CheckpointError(f"{path / name} is not a regular file")
    return fd


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _malformed(record) -> str | None:
    """What in a checksums record is not as `write_checksums` writes it (every reader then
    indexes it freely), or None: files {name: {bytes, sha256?}}, entries [{file, start,
    length, sha256}], tensors {name: sha256}."""
    if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
        return "no files {name: {bytes, sha256}}"
    for name, rec in record["files"].items():
        if not (isinstance(rec, dict) and _count(rec.get("bytes"))) or not isinstance(
            rec.get("sha256", ""), str
        ):
            return f"files[{name!r}] = {rec!r} is not {{bytes: int >= 0, sha256: str}}"
    entries = record.get("entries", [])
    if not isinstance(entries, list):
        return "entries is not a list"
    for e in entries:
        if not (
            isinstance(e, dict)
            and isinstance(e.get("file"), str)
            and _count(e.get("start"))
            and _count(e.get("length"))
            and isinstance(e.get("sha256"), str)
        ):
            return f"entry {e!r} is not {{file, start, length, sha256}}"
    tensors = record.get("tensors", {})
    if not isinstance(tensors, dict) or not all(isinstance(v, str) for v in tensors.values()):
        return "tensors is not {name: sha256}"
    return None


def _pin_dir(path: Path, dfd: int) -> Pinned | None:
    """The version in the open directory `dfd`; None when a save removed it meanwhile."""
    fds: dict[str, int] = {}
    try:
        fd = _open_in(dfd, path, CHECKSUMS)
        with os.fdopen(fd, "rb") as f:
            raw = f.read()
        try:
            record = json.loads(raw)
            names = list(record["files"])
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{path / CHECKSUMS} cannot be read as JSON ({e})") from e
        if why := _malformed(record):
            raise CheckpointError(f"{path / CHECKSUMS} is not a checksums record: {why}")
        for name in names:
            fds[name] = _open_in(dfd, path, name)
    except FileNotFoundError as e:
        for fd in fds.values():
            os.close(fd)
        if not _same(dfd, path):
            return None  # a save replaced this version while it was being opened: again
        missing = Path(e.filename or "").name or CHECKSUMS
        if missing == CHECKSUMS:
            raise CheckpointError(
                f"{path} is not a complete checkpoint (no {CHECKSUMS}: a save that never "
                "completed, or a checkpoint written by something else)"
            ) from None
        raise CheckpointError(f"{path / missing} is missing (the checkpoint lists it)") from None
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise
    return Pinned(path, record, hashlib.sha256(raw).hexdigest(), fds)


def pin(path: Path, who: str = "load") -> Pinned:
    """Hold one complete version of the checkpoint at `path` open (see the module)."""
    for _ in range(ATTEMPTS):
        try:
            dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            if recover(path):  # a save killed between its renames: finished
                continue
            if swapping(path):  # a live save between its renames: wait for it
                time.sleep(0.001)
                continue
            if not absent(path):  # its second rename came after the open: open it now
                continue
            raise FileNotFoundError(f"{who}: no checkpoint at {path}") from None
        except NotADirectoryError:
            raise CheckpointError(f"{who}: {path} is not a checkpoint directory") from None
        try:
            pinned = _pin_dir(path, dfd)
        finally:
            os.close(dfd)
        if pinned is not None:
            return pinned
    raise CheckpointError(
        f"{who}: {path} was replaced {ATTEMPTS} times while it was being opened; saves "
        "follow each other too fast to read one whole"
    )


def same_everywhere(group, digest: str | None, error: BaseException | None = None) -> bool:
    """Every rank of `group` calls it with its pinned version's digest, or the error it met.
    Raises on every rank when any rank failed (its own error, or a `CheckpointError` naming
    the failed rank: nobody is left waiting in a collective); else True when all pinned the
    same version."""
    mine = (digest, None if error is None else f"{type(error).__name__}: {error}")
    everyone: list = [None] * dist.get_world_size(group)
    comm.all_gather_object(everyone, mine, group=group, tag="checkpoint")
    if error is not None:
        raise error
    failed = [(r, e) for r, (_, e) in enumerate(everyone) if e is not None]
    if failed:
        r, e = failed[0]
        raise CheckpointError(f"rank {r} of the group failed: {e}")
    return len({d for d, _ in everyone}) == 1


def raise_everywhere(group, message: str | None) -> None:
    """Raise the same `CheckpointError` on every rank of `group` when any rank passes a
    message (the first rank's), nothing otherwise; every rank calls it. `group` False: one
    process, no collective."""
    messages = [message]
    if group is not False:
        messages = [None] * dist.get_world_size(group)
        comm.all_gather_object(messages, message, group=group, tag="checkpoint")
    first = next((m for m in messages if m is not None), None)
    if first is not None:
        raise CheckpointError(first)
