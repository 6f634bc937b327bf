"""Key-sorted save/load (minidist/embedding/checkpoint.py): train k steps, save, load into a
fresh layer and optimizer, continue; the result equals an uninterrupted run bitwise (every
computation is per row and per occurrence in input order, so the new row numbers do not
enter it). Also for the distributed layers on a world of 2, each rank its own shard; a load
on another world keeps every key and its optimizer state; a save killed on one rank leaves
the previous checkpoint whole; a damaged file is named before anything changes.
"""

import os
import shutil
from unittest import mock

import pytest
import torch
import torch.distributed as dist

import minidist
from minidist.checkpoint_files import CHECKSUMS, CheckpointError, file_record, read_json, write_json
from minidist.embedding import checkpoint
from minidist.embedding.distributed import (
    DistributedSlotSparseEmbeddingHash,
    LocalizedSlotSparseEmbeddingHash,
)
from minidist.embedding.layers import HashEmbeddingBag, to_csr
from minidist.embedding.optim import SparseAdagrad, SparseAdam, SparseSGD

STEPS, SAVE_AT, DIM, SLOTS = 4, 2, 3, 2
OPTIMIZERS = {
    "sgd": lambda p: SparseSGD(p, lr=0.1),
    "momentum_local": lambda p: SparseSGD(p, lr=0.1, momentum=0.9),
    "adagrad": lambda p: SparseAdagrad(p, lr=0.1),
    "adam_local": lambda p: SparseAdam(p, lr=0.01),
    "adam_global": lambda p: SparseAdam(p, lr=0.01, update="global"),
}


def batch(step: int, rank: int = 0):
    """Sample-major bags over SLOTS slots, new keys arriving at every step (slot s: keys
    s*1000 + id), so the loaded table's rows differ from the original's claim order."""
    g = torch.Generator().manual_seed(10 * step + rank)
    bags = []
    for _ in range(3):
        for s in range(SLOTS):
            n = int(torch.randint(0, 4, (1,), generator=g))
            bags.append(
                [s * 1000 + int(k) for k in torch.randint(-5, 6 + 3 * step, (n,), generator=g)]
            )
    return to_csr(bags)


def train(layer, optimizer, steps, rank: int = 0):
    for step in steps:
        out = layer(*batch(step, rank))
        optimizer.zero_grad()
        (out.pow(2).sum() + out.sum()).backward()
        optimizer.step()


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_resume_equals_an_uninterrupted_run(opt, tmp_path):
    whole = HashEmbeddingBag(64, DIM, "mean")
    whole_optimizer = OPTIMIZERS[opt]([whole.weight])
    train(whole, whole_optimizer, range(STEPS))

    first = HashEmbeddingBag(64, DIM, "mean")
    optimizer = OPTIMIZERS[opt]([first.weight])
    train(first, optimizer, range(SAVE_AT))
    checkpoint.save(first, optimizer, tmp_path)
    resumed = HashEmbeddingBag(64, DIM, "mean")
    optimizer = OPTIMIZERS[opt]([resumed.weight])
    checkpoint.load(resumed, optimizer, tmp_path)
    assert torch.equal(resumed.dump()[0], first.dump()[0])
    train(resumed, optimizer, range(SAVE_AT, STEPS))

    keys, vectors = resumed.dump()
    want_keys, want_vectors = whole.dump()
    assert torch.equal(keys, want_keys) and torch.equal(vectors, want_vectors)
    saved = checkpoint.embedding_state_dict(resumed, optimizer)
    want = checkpoint.embedding_state_dict(whole, whole_optimizer)  # the optimizer state too
    assert saved["optimizer"].keys() == want["optimizer"].keys()
    assert all(torch.equal(saved["optimizer"][k], want["optimizer"][k]) for k in want["optimizer"])
    assert saved["optimizer_other"] == want["optimizer_other"]


def distributed_rank(kind: str, directory: str):
    rank = dist.get_rank()

    def build():
        if kind == "localized":
            layer = LocalizedSlotSparseEmbeddingHash(64, DIM, SLOTS, "mean")
        else:
            layer = DistributedSlotSparseEmbeddingHash(64, DIM, SLOTS, "mean", scheme=kind)
        return layer, SparseAdam([layer.local.weight], lr=0.01, update="global")

    whole, optimizer = build()
    train(whole, optimizer, range(STEPS), rank)
    first, optimizer = build()
    train(first, optimizer, range(SAVE_AT), rank)
    checkpoint.save(first, optimizer, directory)
    resumed, optimizer = build()
    checkpoint.load(resumed, optimizer, directory)
    train(resumed, optimizer, range(SAVE_AT, STEPS), rank)
    return whole.dump(), resumed.dump()


@pytest.mark.parametrize("kind", ["reduce_scatter", "all_to_all", "localized"])
def test_each_rank_resumes_its_shard(kind, tmp_path):
    for (want_keys, want_vectors), (keys, vectors) in minidist.launch(
        distributed_rank, 2, kind, str(tmp_path)
    ):
        assert torch.equal(keys, want_keys) and torch.equal(vectors, want_vectors)


def test_bad_loads_are_named(tmp_path):
    layer = HashEmbeddingBag(32, DIM)
    optimizer = SparseAdagrad([layer.weight])
    train(layer, optimizer, range(1))
    state = checkpoint.embedding_state_dict(layer, optimizer)
    with pytest.raises(ValueError, match="already holds"):
        checkpoint.load_embedding_state_dict(layer, optimizer, state)
    other = HashEmbeddingBag(32, DIM + 1)
    with pytest.raises(ValueError, match="dim=3.*dim=4"):
        checkpoint.load_embedding_state_dict(other, None, state)
    plain = HashEmbeddingBag(32, DIM)
    with pytest.raises(ValueError, match=r"optimizer states \['sum'\].*has \[\]"):
        checkpoint.load_embedding_state_dict(plain, SparseSGD([plain.weight], lr=0.1), state)
    small = HashEmbeddingBag(2, DIM)
    with pytest.raises(RuntimeError, match="capacity=2"):
        checkpoint.load_embedding_state_dict(small, SparseAdagrad([small.weight]), state)
    assert small.table.size == 0
    with pytest.raises(FileNotFoundError, match="no embedding checkpoint at .*absent"):
        checkpoint.load(plain, None, tmp_path / "absent")


# -- resharding, interrupted saves, damaged files --------------------------------------------------
def _distributed(kind="reduce_scatter"):
    if kind == "localized":
        layer = LocalizedSlotSparseEmbeddingHash(256, DIM, SLOTS, "mean")
    else:
        layer = DistributedSlotSparseEmbeddingHash(256, DIM, SLOTS, "mean", scheme=kind)
    return layer, SparseAdam([layer.local.weight], lr=0.01, update="global")


def _union(states):
    """Every rank's (keys, vectors, optimizer rows) as one key-sorted state."""
    keys = torch.cat([s["keys"] for s in states])
    order = torch.argsort(keys)
    rows = {"vectors": torch.cat([s["vectors"] for s in states])[order]}
    for name in states[0]["optimizer"]:
        rows[name] = torch.cat([s["optimizer"][name] for s in states])[order]
    return keys[order], rows


def save_rank(directory, kind="reduce_scatter", kill_second_save=False):
    """Train 2 steps, save; with `kill_second_save`, one more step and a save that rank 1
    dies in the middle of writing. Returns this rank's saved state."""
    rank = dist.get_rank()
    layer, optimizer = _distributed(kind)
    train(layer, optimizer, range(2), rank)
    checkpoint.save(layer, optimizer, directory)
    state = checkpoint.embedding_state_dict(layer, optimizer)
    if kill_second_save:
        train(layer, optimizer, range(2, 3), rank)
        if rank == 1:

            def half_write(obj, f):
                f.write(b"PK\x03\x04 half a file")
                f.flush()
                os._exit(1)

            mock.patch.object(torch, "save", half_write).start()
        checkpoint.save(layer, optimizer, directory)
    return state


def load_rank(directory, kind="reduce_scatter"):
    layer, optimizer = _distributed(kind)
    try:
        checkpoint.load(layer, optimizer, directory)
    except CheckpointError as e:
        return str(e)
    return checkpoint.embedding_state_dict(layer, optimizer)


def load_whole(directory):
    layer = HashEmbeddingBag(512, DIM, "mean")
    optimizer = SparseAdam([layer.weight], lr=0.01, update="global")
    checkpoint.load(layer, optimizer, directory)
    return checkpoint.embedding_state_dict(layer, optimizer)


def assert_same_keys_and_state(loaded, saved):
    keys, rows = _union(loaded)
    want_keys, want_rows = _union(saved)
    assert torch.equal(keys, want_keys) and keys.numel() > 10
    assert rows.keys() == want_rows.keys() == {"vectors", "exp_avg", "exp_avg_sq"}
    assert all(torch.equal(rows[k], want_rows[k]) for k in rows)
    assert all(s["optimizer_other"] == saved[0]["optimizer_other"] for s in loaded)


def test_a_checkpoint_reshards_onto_any_world(tmp_path):
    on2 = minidist.launch(save_rank, 2, tmp_path / "on2")
    on4 = minidist.launch(save_rank, 4, tmp_path / "on4")
    assert_same_keys_and_state([load_whole(tmp_path / "on2")], on2)  # 2 -> 1
    assert_same_keys_and_state(minidist.launch(load_rank, 4, tmp_path / "on2"), on2)  # 2 -> 4
    on3 = minidist.launch(load_rank, 3, tmp_path / "on4")  # 4 -> 3, each rank its own keys
    assert_same_keys_and_state(on3, on4)
    for rank, state in enumerate(on3):
        assert bool((torch.remainder(state["keys"], 3) == rank).all())


def test_localized_slots_reshard_onto_a_divisor_and_refuse_otherwise(tmp_path):
    on4 = minidist.launch(save_rank, 4, tmp_path / "on4", "localized")
    assert_same_keys_and_state(minidist.launch(load_rank, 2, tmp_path / "on4", "localized"), on4)
    assert_same_keys_and_state([load_whole(tmp_path / "on4")], on4)
    errors = minidist.launch(load_rank, 3, tmp_path / "on4", "localized")
    assert all("places keys by slot" in e and "divides its own" in e for e in errors)


def test_a_save_killed_on_one_rank_leaves_the_previous_checkpoint(tmp_path):
    with pytest.raises(minidist.RankFailedError, match="rank 1"):
        minidist.launch(save_rank, 2, tmp_path / "ckpt", "reduce_scatter", True)
    assert (tmp_path / ".ckpt.unfinished").is_dir()
    # the first save, whole: every rank's keys and optimizer rows, its counters
    directory = tmp_path / "ckpt"
    saved = [torch.load(checkpoint.rank_path(directory, r), weights_only=True) for r in (0, 1)]
    assert_same_keys_and_state([load_whole(directory)], saved)
    assert saved[0]["optimizer_other"]["step"] == 2


def _saved_one(tmp_path):
    layer = HashEmbeddingBag(64, DIM)
    optimizer = SparseAdagrad([layer.weight])
    train(layer, optimizer, range(2))
    checkpoint.save(layer, optimizer, tmp_path / "ckpt")
    return tmp_path / "ckpt"


@pytest.mark.parametrize("how", ["one float", "truncated", "empty", "missing", "no checksums"])
def test_a_damaged_file_is_named_before_anything_changes(tmp_path, how):
    directory = _saved_one(tmp_path)
    path = checkpoint.rank_path(directory, 0)
    if how == "one float":  # a float of the vectors, overwritten in place in the file
        vectors = torch.load(path, weights_only=True)["vectors"]
        data = path.read_bytes()
        at = data.index(vectors.numpy().tobytes()) + 4 * (DIM + 1)  # vectors[1, 1]
        changed = torch.tensor([float(vectors[1, 1]) + 1000.0]).numpy().tobytes()
        path.write_bytes(data[:at] + changed + data[at + 4 :])
        want = "tensor vectors differs"
    elif how == "truncated":
        path.write_bytes(path.read_bytes()[:-100])
        want = "truncated"
    elif how == "empty":
        path.write_bytes(b"")
        want = "is empty: 0 bytes"
    elif how == "missing":
        path.unlink()
        want = "is missing"
    else:
        (directory / CHECKSUMS).unlink()
        want = "not a complete embedding checkpoint"
    fresh = HashEmbeddingBag(64, DIM)
    with pytest.raises(CheckpointError, match=want) as info:
        checkpoint.load(fresh, SparseAdagrad([fresh.weight]), directory)
    assert fresh.table.size == 0 and isinstance(info.value, Exception)
    assert how == "no checksums" or path.name in str(info.value)


def test_save_refuses_a_directory_that_is_not_a_checkpoint(tmp_path):
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "notes.txt").write_text("mine")
    layer = HashEmbeddingBag(8, DIM)
    with pytest.raises(FileExistsError, match="not an embedding checkpoint"):
        checkpoint.save(layer, None, tmp_path / "precious")
    assert (tmp_path / "precious" / "notes.txt").read_text() == "mine"
    assert read_json(_saved_one(tmp_path) / CHECKSUMS)["world"] == 1
    shutil.rmtree(tmp_path / "ckpt")


@pytest.mark.parametrize("how", ["a key twice", "counters differ"])
def test_rank_files_that_contradict_each_other_are_refused(tmp_path, how):
    """Sealed again by whoever changed them (sizes, hashes and tensors match the files)."""
    directory = tmp_path / "on2"
    minidist.launch(save_rank, 2, directory)
    first, second = (checkpoint.rank_path(directory, r) for r in (0, 1))
    manifest = read_json(directory / CHECKSUMS)
    if how == "a key twice":  # rank 1's file a copy of rank 0's: every key in both
        shutil.copyfile(first, second)
        manifest["files"][second.name] = manifest["files"][first.name]
        want = "is in more than one rank's file"
    else:
        state = torch.load(second, weights_only=True)
        state["optimizer_other"]["step"] = state["optimizer_other"]["step"] + 1
        torch.save(state, second)
        manifest["files"][second.name].update(file_record(second))
        want = "the ranks saved different optimizer counters"
    write_json(directory / CHECKSUMS, manifest)
    with pytest.raises(CheckpointError, match=want):
        load_whole(directory)
