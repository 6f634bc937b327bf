"""Checkpoints read and written at once (issue 27): a load during repeated saves reads one
whole saved version, never a mix; a reader never breaks a save; a second save to one path
is refused on its every rank; a save whose seal fails raises the same error on every rank.

The loads run in a forked process looping while a world saves version after version: every
tensor of version v holds the value v, so a mix of two versions is a state dict with two
values. Before the fix, 150 saves gave 37 mixed reads and 18 spurious errors in 1206 reads.
"""

import multiprocessing
import shutil
import threading
import time
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import minidist
from minidist import checkpoint_pin
from minidist.checkpoint_files import CHECKSUMS, CheckpointError, Staging
from minidist.embedding import checkpoint as embedding_checkpoint
from minidist.embedding.distributed import DistributedSlotSparseEmbeddingHash, key_owner
from minidist.embedding.layers import HashEmbeddingBag
from minidist.fsdp import FullyShardedDataParallel, checkpoint, checkpoint_full
from minidist.pieces import Piece
from minidist.resilience import TrainingState, universal

VERSIONS = 40  # saves while the reader loops (before the fix: ~1 mixed read per 4 saves)


def tiny_fsdp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 3), nn.Linear(3, 2))
    return FullyShardedDataParallel(model, wrap=lambda m: isinstance(m, nn.Linear))


def fsdp_saves(path, versions):
    """Version v: every parameter element equals v, saved over the previous one."""
    fsdp = tiny_fsdp()
    for v in range(versions):
        with torch.no_grad():
            for p in fsdp.sharded_parameters():
                p.fill_(float(v))
        checkpoint.save(path, fsdp)
    return "saved"


def embedding_layer():
    return DistributedSlotSparseEmbeddingHash(64, 3, 2, "mean", scheme="reduce_scatter")


def embedding_saves(path, versions):
    """Every rank's keys 0..15 of both slots; version v: every vector element equals v."""
    layer = embedding_layer()
    keys = torch.arange(16, dtype=torch.int64)
    layer.local.table.insert(keys[key_owner(keys, dist.get_world_size()) == dist.get_rank()])
    for v in range(versions):
        with torch.no_grad():
            layer.local.weight.fill_(float(v))
        embedding_checkpoint.save(layer, None, path)
    return "saved"


def fsdp_values(path) -> set:
    state, _ = checkpoint.load_full(path)
    return {float(x) for t in state.values() for x in t.reshape(-1)}


def embedding_values(path) -> set:
    layer = HashEmbeddingBag(64, 3, "mean")
    embedding_checkpoint.load(layer, None, path)
    keys, vectors = layer.dump()
    assert keys.numel() == 16  # every rank's file, whole
    return {float(x) for x in vectors.reshape(-1)}


def read_loop(values, path, stop, out):
    """In a forked process: load until `stop`; (reads, mixed, errors, versions, messages)."""
    reads = mixed = errors = 0
    seen, messages = set(), []
    while not path.exists() and not stop.is_set():
        time.sleep(0.001)
    while not stop.is_set():
        try:
            got = values(path)
        except Exception as e:
            errors += 1
            messages.append(repr(e)[:300])
            continue
        reads, mixed, seen = reads + 1, mixed + (len(got) != 1), seen | got
    out.put((reads, mixed, errors, len(seen), messages[:3]))


@pytest.mark.parametrize("kind", ["fsdp", "embedding"])
def test_a_load_during_repeated_saves_reads_whole_versions(tmp_path, kind):
    saves, values = {
        "fsdp": (fsdp_saves, fsdp_values),
        "embedding": (embedding_saves, embedding_values),
    }[kind]
    path = tmp_path / "ckpt"
    ctx = multiprocessing.get_context("fork")
    stop, out = ctx.Event(), ctx.Queue()
    reader = ctx.Process(target=read_loop, args=(values, path, stop, out))
    reader.start()
    try:
        results = minidist.launch(saves, 2, path, VERSIONS)  # no save broken by the reader
    finally:
        stop.set()
        reads, mixed, errors, versions, messages = out.get(timeout=120)
        reader.join()
    assert results == ["saved", "saved"]
    assert (mixed, errors, messages) == (0, 0, [])
    assert reads >= 5 and versions >= 2  # it did read while saves replaced the checkpoint
    assert values(path) == {float(VERSIONS - 1)}


def distributed_loads(path, versions_path, rounds):
    """Each rank loads the FSDP checkpoint `rounds` times; the value each load held."""
    fsdp, got = tiny_fsdp(), []
    while not path.exists():
        time.sleep(0.001)
    for _ in range(rounds):
        checkpoint.load(path, fsdp)
        got.append({float(x) for t in fsdp.full_parameters().values() for x in t.reshape(-1)})
    return got


def test_ranks_loading_together_during_saves_read_the_same_version(tmp_path):
    """Two worlds at once: one saves, the other loads (each rank pins; they agree)."""
    path = tmp_path / "ckpt"
    ctx = multiprocessing.get_context("fork")
    saver = ctx.Process(target=minidist.launch, args=(fsdp_saves, 2, path, VERSIONS))
    saver.start()
    try:
        loaded = minidist.launch(distributed_loads, 2, path, None, 15)
    finally:
        saver.join(timeout=300)
    assert saver.exitcode == 0
    for per_rank in zip(*loaded):  # the same load on both ranks: one whole version
        assert all(len(v) == 1 for v in per_rank) and len(set.union(*per_rank)) == 1


# -- a reader never breaks a save -------------------------------------------------------------
def _a_version(tmp_path, value) -> Path:
    """A complete single-process checkpoint whose tensors all hold `value`."""
    path = tmp_path / f"v{value}"
    minidist.launch(fsdp_saves, 1, path, value + 1)
    return path


def test_a_load_waits_for_a_live_save_between_its_renames(tmp_path):
    """A save between its two renames (its staging folder complete and locked, `ckpt`
    moved aside): a load waits for it instead of finishing the swap itself, and the save's
    own rename still succeeds."""
    path = tmp_path / "ckpt"
    shutil.copytree(_a_version(tmp_path, 1), path)
    staging = Staging(path)  # a live save of version 2, about to put it in place
    shutil.copytree(_a_version(tmp_path, 2), staging.folder, dirs_exist_ok=True)
    path.rename(tmp_path / ".ckpt.replaced")  # its first rename
    got = []
    reader = threading.Thread(target=lambda: got.append(fsdp_values(path)))
    reader.start()
    time.sleep(0.3)
    assert reader.is_alive() and staging.folder.is_dir()  # waiting, the swap left to the save
    staging.put_in_place()  # the save's second rename: not stolen
    staging.release()
    reader.join(timeout=30)
    assert got == [{2.0}]


# -- two worlds, one path; a failed seal ------------------------------------------------------
def _fail_on_rank0(patch):
    """Rank 0's `patch` raises: a full disk, or (the checksums) a file it cannot read."""
    if patch is not None and dist.get_rank() == 0:
        error = OSError if "put_in_place" in patch or "_write" in patch else CheckpointError
        mock.patch(patch, side_effect=error("disk full (injected)")).start()


def save_or_error(path, patch=None):
    fsdp = tiny_fsdp()
    _fail_on_rank0(patch)
    try:
        checkpoint.save(path, fsdp)
    except CheckpointError as e:
        return str(e)
    return "saved"


def embedding_save_or_error(path, patch=None):
    layer = embedding_layer()
    _fail_on_rank0(patch)
    try:
        embedding_checkpoint.save(layer, None, path)
    except CheckpointError as e:
        return str(e)
    return "saved"


def universal_save_or_error(path, patch=None):
    """Lesson 18's universal format: each rank owns half of one tensor."""
    rank = dist.get_rank()
    mine = torch.full((2, 4), float(rank))
    pieces = [Piece("w", (4, 4), (2 * rank, 0), (2, 4), None, mine)]
    _fail_on_rank0(patch)
    try:
        universal.save(path, pieces, TrainingState(step=3), {"dp": 2})
    except CheckpointError as e:
        return str(e)
    return "saved"


SAVES = [save_or_error, embedding_save_or_error, universal_save_or_error]


@pytest.mark.parametrize("save", SAVES)
def test_a_second_save_to_one_path_is_refused_on_every_rank(tmp_path, save):
    path = tmp_path / "ckpt"
    other = Staging(path)  # another world's save, running
    errors = minidist.launch(save, 2, path)
    assert errors[0] == errors[1] and "another save to" in errors[0] and "is running" in errors[0]
    assert not path.exists() and other.folder.is_dir() and not any(other.folder.iterdir())
    other.release()
    assert minidist.launch(save, 2, path) == ["saved", "saved"]
    assert (path / CHECKSUMS).is_file() and not other.folder.exists()


@pytest.mark.parametrize(
    "save, patch",
    [
        (save_or_error, "minidist.fsdp.checkpoint_safe.write_checksums"),  # the seal
        (save_or_error, "minidist.checkpoint_files.Staging.put_in_place"),
        (embedding_save_or_error, "minidist.embedding.checkpoint.read_json"),
        (embedding_save_or_error, "minidist.checkpoint_files.Staging.put_in_place"),
        (embedding_save_or_error, "minidist.embedding.checkpoint._write"),  # its own file
        (universal_save_or_error, "minidist.fsdp.checkpoint_safe.write_checksums"),
        (universal_save_or_error, "minidist.checkpoint_files.Staging.put_in_place"),
    ],
)
def test_a_seal_that_fails_raises_the_same_error_on_every_rank(tmp_path, save, patch):
    path = tmp_path / "ckpt"
    assert minidist.launch(save, 2, path) == ["saved", "saved"]
    before = {p.name: p.read_bytes() for p in path.iterdir()}
    errors = minidist.launch(save, 2, path, patch)  # rank 0 fails; no rank dies in gloo
    assert errors[0] == errors[1]
    assert "rank 0 could not" in errors[0] and "disk full (injected)" in errors[0]
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before  # the old one, whole


def stale_first_read(path, other, module, name):
    """Rank 1's first pin reads `other` (as if a save replaced `path` between the ranks'
    pins), later ones `path`; returns what the load left in the model."""
    if dist.get_rank() == 1:
        real, calls = getattr(module, name), []

        def stale(where, *args):
            calls.append(where)
            return real(other if len(calls) == 1 else where, *args)

        mock.patch.object(module, name, stale).start()
    if module is checkpoint:
        fsdp = tiny_fsdp()
        checkpoint.load(path, fsdp)
        return {float(x) for t in fsdp.full_parameters().values() for x in t.reshape(-1)}
    if module is universal:
        rank, mine = dist.get_rank(), torch.empty(2, 4)
        universal.load(path, [Piece("w", (4, 4), (2 * rank, 0), (2, 4), None, mine)])
        return {float(x) for x in mine.reshape(-1)}
    layer = embedding_layer()
    embedding_checkpoint.load(layer, None, path)
    return {float(x) for x in layer.local.weight[: layer.local.table.size].reshape(-1)}


def universal_saves(path, versions):
    """Version v: every element of the one tensor equals v (each rank owns half of it)."""
    rank = dist.get_rank()
    for v in range(versions):
        piece = Piece("w", (4, 4), (2 * rank, 0), (2, 4), None, torch.full((2, 4), float(v)))
        universal.save(path, [piece], TrainingState(step=v), {"dp": 2})
    return "saved"


@pytest.mark.parametrize("kind", ["fsdp", "embedding", "universal"])
def test_ranks_that_pinned_different_versions_pin_again(tmp_path, kind):
    """Deterministic: rank 1 first pins version 1, rank 0 version 2; they agree on 2. The
    universal load pinned each rank's own version: rank 1 loaded 1.0 beside rank 0's 2.0."""
    saves = {"fsdp": fsdp_saves, "embedding": embedding_saves, "universal": universal_saves}
    minidist.launch(saves[kind], 2, tmp_path / "v1", 2)
    minidist.launch(saves[kind], 2, tmp_path / "v2", 3)
    module, name = {
        "fsdp": (checkpoint, "_read"),
        "embedding": (embedding_checkpoint, "_pin"),
        "universal": (universal, "pin"),
    }[kind]
    loaded = minidist.launch(stale_first_read, 2, tmp_path / "v2", tmp_path / "v1", module, name)
    assert loaded == [{2.0}, {2.0}]


def test_a_version_removed_while_it_is_pinned_is_pinned_again(tmp_path):
    """Deterministic: right after the checksums file is opened, a save replaces `ckpt` and
    deletes the old files; the pin starts again and holds the new version whole."""
    path = tmp_path / "ckpt"
    shutil.copytree(_a_version(tmp_path, 1), path)
    newer, real, swapped = _a_version(tmp_path, 2), checkpoint_pin._open_in, []

    def open_during_a_save(dfd, where, name):
        if name != CHECKSUMS and not swapped:  # the save's renames and its removal
            swapped.append(name)
            path.rename(tmp_path / ".ckpt.replaced")
            shutil.copytree(newer, path)
            shutil.rmtree(tmp_path / ".ckpt.replaced")
        return real(dfd, where, name)

    with mock.patch.object(checkpoint_pin, "_open_in", open_during_a_save):
        assert fsdp_values(path) == {2.0}
    assert swapped


def test_a_save_after_the_checks_leaves_the_pinned_version_to_read(tmp_path):
    """Deterministic: a load pinned and verified version 1, then a save puts version 2 in
    place and deletes version 1's files before DCP reads the tensors; DCP reads through the
    held descriptors, so the load is version 1, whole (a reopen by name read version 2)."""
    path = tmp_path / "ckpt"
    shutil.copytree(_a_version(tmp_path, 1), path)
    newer, real = _a_version(tmp_path, 2), checkpoint_full.dcp_load

    def save_then_read(*args, **kwargs):  # the save's renames and its removal, then DCP
        path.rename(tmp_path / ".ckpt.replaced")
        shutil.copytree(newer, path)
        shutil.rmtree(tmp_path / ".ckpt.replaced")
        return real(*args, **kwargs)

    with mock.patch.object(checkpoint_full, "dcp_load", save_then_read):
        assert fsdp_values(path) == {1.0}
    assert fsdp_values(path) == {2.0}  # the save did replace it


def test_a_swap_that_ends_after_a_load_found_the_path_missing_is_loaded(tmp_path):
    """Deterministic (the baseline that once failed under load): a load's open of `ckpt`
    fails between a save's two renames, and the save's second rename comes before the load
    looks at the save. Before the fix the load saw `ckpt` back and no swap under way, and
    said "no checkpoint at ckpt; the checkpoint it replaced is in .ckpt.replaced"; now it
    opens the new version."""
    path = tmp_path / "ckpt"
    shutil.copytree(_a_version(tmp_path, 1), path)
    staging = Staging(path)  # a live save of version 2
    shutil.copytree(_a_version(tmp_path, 2), staging.folder, dirs_exist_ok=True)
    path.rename(tmp_path / ".ckpt.replaced")  # its first rename
    real, late = checkpoint_pin.recover, []

    def second_rename_first(where):  # what the load does first after its open failed
        if not late:
            late.append(where)
            staging.folder.rename(path)  # the save's second rename; .ckpt.replaced still there
        return real(where)

    try:
        with mock.patch.object(checkpoint_pin, "recover", second_rename_first):
            assert fsdp_values(path) == {2.0}
    finally:
        staging.release()
    assert late and (tmp_path / ".ckpt.replaced").is_dir()  # the interleaving happened
