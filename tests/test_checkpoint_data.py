"""A checkpoint is data, checked before it is used (issue 27): the metadata unpickler builds
nothing that reaches code (every global of the modules a payload would use, sampled whole);
metadata that does not cover its tensors exactly is refused before anything is allocated;
every read path checks whole-file checksums; sidecars are written beside and renamed; a
checkpoint with entries the model lacks is refused, naming them."""

import importlib
import io
import json
import os
import pickle
import re
import shutil
from unittest import mock

import pytest
import torch
import torch.distributed.checkpoint.metadata as dcp_metadata
import torch.nn as nn

import minidist
from minidist import checkpoint_files
from minidist.checkpoint_files import CHECKSUMS, CheckpointError, file_record, read_json, write_json
from minidist.embedding import checkpoint as embedding_checkpoint
from minidist.embedding.layers import HashEmbeddingBag
from minidist.embedding.optim import SparseAdagrad
from minidist.fsdp import FullyShardedDataParallel, checkpoint
from minidist.fsdp.checkpoint_safe import _allowed

METADATA = "torch.distributed.checkpoint.metadata"


def tiny(extra: str | None = None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 3), nn.Linear(3, 2))
    if extra == "buffer":
        model.register_buffer("extra", torch.ones(3))
    elif extra == "parameter":
        model.register_parameter("extra", nn.Parameter(torch.ones(3)))
    return model


def save_tiny(path, extra=None):
    fsdp = FullyShardedDataParallel(tiny(extra), wrap=lambda m: isinstance(m, nn.Linear))
    opt = torch.optim.Adam(fsdp.sharded_parameters(), lr=0.1)
    fsdp(torch.ones(4, 5)).sum().backward()
    fsdp.finish_gradient_sync()
    opt.step()
    checkpoint.save(path, fsdp, opt)


def load_tiny(path):
    fsdp = FullyShardedDataParallel(tiny(), wrap=lambda m: isinstance(m, nn.Linear))
    try:
        checkpoint.load(path, fsdp, torch.optim.Adam(fsdp.sharded_parameters(), lr=0.1))
    except (CheckpointError, checkpoint.CheckpointMismatchError) as e:
        return str(e)
    return "loaded"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    minidist.launch(save_tiny, 2, root / "ckpt")
    return root / "ckpt"


def _copy(saved, tmp_path):
    shutil.copytree(saved, tmp_path / "copy")
    return tmp_path / "copy"


# -- the metadata unpickler ------------------------------------------------------------------------
MODULES = [
    "builtins",
    "io",
    "os",
    "posix",
    "subprocess",
    "sys",
    "operator",
    "functools",
    "importlib",
    "pickle",
    "copyreg",
    "codecs",
    "shutil",
    "runpy",
    "types",
    "pathlib",
    "collections",
    "torch",
    "torch.serialization",
    "torch.distributed.checkpoint.filesystem",
    METADATA,
]
DOTTED = [
    "__init__.__globals__",
    "__init__.__builtins__.get",
    "__reduce__",
    "__reduce_ex__",
    "__class__",
    "__subclasses__",
    "system",
    "__dict__",
    "mro",
    "__getattribute__",
    "__new__",
    "create_from_tensor",
    "fromkeys",
    "write_text",
    "__call__",
    "__setstate__",
]


def legitimate() -> set:
    """What a metadata pickle needs: DCP's metadata classes (defined in that module), the
    storage info, torch.Size, dtypes, the layout lookup, paths and OrderedDict."""
    classes = {
        (METADATA, n)
        for n, v in vars(dcp_metadata).items()
        if isinstance(v, type) and v.__module__ == METADATA
    }
    dtypes = {("torch", n) for n, v in vars(torch).items() if isinstance(v, torch.dtype)}
    return (
        classes
        | dtypes
        | {
            ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
            ("torch", "Size"),
            ("torch.serialization", "_get_layout"),
            ("pathlib", "PosixPath"),
            ("pathlib", "PurePosixPath"),
            ("collections", "OrderedDict"),
        }
    )


def candidates():
    for module in MODULES:
        for name in dir(importlib.import_module(module)):
            yield module, name
    for module, name in sorted(legitimate()) + [(METADATA, "os"), (METADATA, "dataclass")]:
        for attr in DOTTED:
            yield module, f"{name}.{attr}"


def test_the_metadata_unpickler_admits_exactly_the_metadata_classes():
    """Every global of the modules a payload reaches code through (builtins' eval, exec,
    open, getattr, __import__; io; os; operator; functools; the metadata module's own
    imports, like `os`) and dotted paths through every admitted class: refused, except
    exactly the classes a metadata pickle holds."""
    legit, tried = legitimate(), 0
    for module, name in candidates():
        tried += 1
        assert _allowed(module, name) == ((module, name) in legit), (module, name)
    assert tried > 2000 and ("builtins", "getattr") not in legit


def _call(module: str, name: str, *args: str) -> bytes:
    """A protocol-4 pickle that calls module.name(*args) (STACK_GLOBAL, REDUCE)."""
    out = b"\x80\x04"
    for s in (module, name):
        out += b"\x8c" + bytes([len(s.encode())]) + s.encode()
    out += b"\x93"
    for a in args:
        out += b"\x8c" + bytes([len(a.encode())]) + a.encode()
    return out + {0: b")", 1: b"\x85", 2: b"\x86", 3: b"\x87"}[len(args)] + b"R."


@pytest.mark.parametrize(
    "module, name, args",
    [
        ("builtins", "eval", ("open({m!r}, 'w')",)),
        ("builtins", "exec", ("open({m!r}, 'w')",)),
        ("builtins", "open", ("{m}", "w")),
        ("io", "open", ("{m}", "w")),
        ("os", "system", ("touch {m}",)),
        ("posix", "system", ("touch {m}",)),
        ("subprocess", "getoutput", ("touch {m}",)),
        (METADATA, "os.system", ("touch {m}",)),
        (METADATA, "Metadata.__init__.__builtins__.get", ("eval",)),
        ("builtins", "getattr", ("{m}", "join")),
        ("builtins", "__import__", ("os",)),
        ("pathlib", "PosixPath.write_text", ("{m}", "x")),
    ],
)
def test_a_crafted_metadata_pickle_runs_nothing(saved, tmp_path, module, name, args):
    marker = tmp_path / "ran"
    crafted = _copy(saved, tmp_path)
    payload = _call(module, name, *(a.format(m=str(marker)) for a in args))
    (crafted / ".metadata").write_bytes(payload)
    _reseal_metadata(crafted)
    with pytest.raises(CheckpointError, match="refused unread"):
        checkpoint.load_full(crafted)
    assert not marker.exists()


# -- metadata that does not cover its tensors ------------------------------------------------------
def _reseal_metadata(path):
    """The checksums record with `.metadata`'s new size and hash (the chunks' as saved)."""
    record = read_json(path / CHECKSUMS)
    record["files"][".metadata"] = file_record(path / ".metadata")
    write_json(path / CHECKSUMS, record)


def _craft(path, how):
    meta = pickle_load(path / ".metadata")
    key = next(k for k, md in meta.state_dict_metadata.items() if k.startswith("model.flat["))
    md = meta.state_dict_metadata[key]
    (_, c1), n = md.chunks, md.size[0]
    if how == "claims 2^34":
        md.size = torch.Size([2**34])
    elif how == "claims 2^28":
        md.size = torch.Size([2**28])
    elif how == "overlap":  # two chunks of the right total inside bounds, [0, a) and [1, 1 + b)
        _move(meta, key, c1, [1])
    elif how == "outside":
        _move(meta, key, c1, [n])
    elif how == "short stored":  # a replicated tensor claiming more elements than stored
        key = next(k for k, md in meta.state_dict_metadata.items() if "step" in k)
        md = meta.state_dict_metadata[key]
        index = next(i for i in meta.storage_data if i.fqn == key)
        claim = meta.storage_data[index].length // 2  # more bytes than stored, not elements
        md.size = torch.Size([claim])
        md.chunks[0] = dcp_metadata.ChunkStorageMetadata(torch.Size([0]), torch.Size([claim]))
        meta.storage_data[dcp_metadata.MetadataIndex(key, [0])] = meta.storage_data.pop(index)
    elif how == "elsewhere":
        index = next(i for i in meta.storage_data if i.fqn == key)
        meta.storage_data[index].relative_path = "../../../etc/passwd"
    elif how == "unchecked bytes":
        index = next(i for i in meta.storage_data if i.fqn == key)
        meta.storage_data[index].offset += 1
    path.joinpath(".metadata").write_bytes(pickle_dumps(meta))
    _reseal_metadata(path)


def _move(meta, key, chunk, offsets):
    md = meta.state_dict_metadata[key]
    i = md.chunks.index(chunk)
    md.chunks[i] = dcp_metadata.ChunkStorageMetadata(torch.Size(offsets), chunk.sizes)
    old = next(
        k for k in meta.storage_data if k.fqn == key and list(k.offset) == list(chunk.offsets)
    )
    meta.storage_data[dcp_metadata.MetadataIndex(key, offsets)] = meta.storage_data.pop(old)


def pickle_load(path):
    return pickle.loads(path.read_bytes())  # our own test's file: a plain unpickler is fine


def pickle_dumps(obj):
    return pickle.dumps(obj)


CRAFTED = [
    ("claims 2^34", "chunks of .* elements, not the 17179869184"),
    ("claims 2^28", "chunks of .* elements, not the 268435456"),
    ("overlap", "overlapping chunks"),
    ("outside", "outside its shape"),
    ("short stored", "its file lacks"),
    ("elsewhere", "stored outside the listed files"),
    ("unchecked bytes", "no checksum covers"),
]


@pytest.mark.parametrize("how, why", CRAFTED)
def test_metadata_that_does_not_cover_its_tensors_is_refused_before_allocating(
    saved, tmp_path, how, why
):
    crafted = _copy(saved, tmp_path)
    _craft(crafted, how)
    with pytest.raises(CheckpointError, match=f"{why}.*refused before allocating"):
        checkpoint.load_full(crafted)


def test_metadata_refusals_reach_every_loading_rank(saved, tmp_path):
    crafted = _copy(saved, tmp_path)
    _craft(crafted, "claims 2^28")
    errors = minidist.launch(load_tiny, 2, crafted)
    assert all("refused before allocating" in e for e in errors)


# -- whole-file checksums on every read path -------------------------------------------------------
def test_a_changed_byte_no_parser_notices_is_refused_by_the_whole_file_checksum(saved, tmp_path):
    """A byte of `.metadata` inside a path string (it still unpickles), then a digit of an
    embedding rank file's serialization id (torch.load ignores it)."""
    crafted = _copy(saved, tmp_path)
    data = bytearray((crafted / ".metadata").read_bytes())
    at = data.index(b"unfinished")
    data[at] = ord("U")
    (crafted / ".metadata").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"\.metadata: its bytes differ"):
        checkpoint.load_full(crafted)
    assert all(".metadata: its bytes differ" in e for e in minidist.launch(load_tiny, 2, crafted))

    layer = HashEmbeddingBag(64, 3)
    optimizer = SparseAdagrad([layer.weight])
    layer(*_bags()).sum().backward()
    optimizer.step()
    embedding_checkpoint.save(layer, optimizer, tmp_path / "emb")
    path = embedding_checkpoint.rank_path(tmp_path / "emb", 0)
    data = bytearray(path.read_bytes())
    at = re.search(rb"\d{30,}", bytes(data)).start() + 3
    data[at] = ord("0") if data[at] != ord("0") else ord("1")
    path.write_bytes(bytes(data))
    torch.load(io.BytesIO(bytes(data)), weights_only=True)  # it still parses
    fresh = HashEmbeddingBag(64, 3)
    with pytest.raises(CheckpointError, match="embedding_rank0.pt: its bytes differ"):
        embedding_checkpoint.load(fresh, SparseAdagrad([fresh.weight]), tmp_path / "emb")


def _bags():
    from minidist.embedding.layers import to_csr

    return to_csr([[1, 2], [3], [2, 5, 7]])


# -- sidecars written beside and renamed -----------------------------------------------------------
def test_an_interrupted_sidecar_write_leaves_the_old_file_whole(tmp_path):
    path = tmp_path / CHECKSUMS
    write_json(path, {"old": 1})

    def half_dump(record, f, **kwargs):
        f.write('{"new": ')
        raise OSError("killed mid-write (injected)")

    with mock.patch.object(checkpoint_files.json, "dump", half_dump):
        with pytest.raises(OSError, match="injected"):
            write_json(path, {"new": 2})
    assert json.loads(path.read_text()) == {"old": 1}


def test_an_interrupted_rank_file_write_leaves_no_file_under_its_name(tmp_path):
    def half_save(obj, f):
        f.write(b"PK\x03\x04 half a file")
        raise OSError("killed mid-write (injected)")

    state = embedding_checkpoint.embedding_state_dict(HashEmbeddingBag(8, 3))
    with mock.patch.object(torch, "save", half_save):
        with pytest.raises(OSError, match="injected"):
            embedding_checkpoint._write(state, tmp_path / "embedding_rank0.pt")
    assert not (tmp_path / "embedding_rank0.pt").exists()


# -- entries the model lacks -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "extra, message",
    [
        ("buffer", "frozen parameter or buffer extra: the checkpoint has [3], this model has no"),
        (
            "parameter",
            "trainable parameter extra: the checkpoint has [3] torch.float32, this "
            "model has no such parameter",
        ),
    ],
)
def test_a_checkpoint_with_entries_the_model_lacks_is_refused_naming_them(tmp_path, extra, message):
    minidist.launch(save_tiny, 2, tmp_path / "ckpt", extra)
    for error in minidist.launch(load_tiny, 2, tmp_path / "ckpt"):
        assert message in error


def test_an_embedding_file_with_a_tensor_its_record_lacks_is_refused(tmp_path):
    layer = HashEmbeddingBag(64, 3)
    optimizer = SparseAdagrad([layer.weight])
    layer(*_bags()).sum().backward()
    optimizer.step()
    directory = tmp_path / "emb"
    embedding_checkpoint.save(layer, optimizer, directory)
    path = embedding_checkpoint.rank_path(directory, 0)
    state = torch.load(path, weights_only=True)
    state["optimizer"]["extra"] = torch.zeros_like(state["optimizer"]["sum"])
    torch.save(state, path)
    manifest = read_json(directory / CHECKSUMS)
    manifest["files"][path.name].update(file_record(path))  # sizes and hash, not its tensors
    write_json(directory / CHECKSUMS, manifest)
    fresh = HashEmbeddingBag(64, 3)
    with pytest.raises(CheckpointError, match=r"tensors \['optimizer.extra'\] are not in"):
        embedding_checkpoint.load(fresh, SparseAdagrad([fresh.weight]), directory)
    assert fresh.table.size == 0


class _Payload:
    """Unpickled, it would create `marker` (what a crafted rank file could do)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_an_embedding_rank_file_with_a_payload_runs_nothing(tmp_path):
    """Sealed again by whoever crafted it (sizes and hash match): still read as tensors only."""
    marker, directory = tmp_path / "ran", tmp_path / "emb"
    embedding_checkpoint.save(HashEmbeddingBag(8, 3), None, directory)
    path = embedding_checkpoint.rank_path(directory, 0)
    state = torch.load(path, weights_only=True)
    state["mode"] = _Payload(marker)
    torch.save(state, path)
    manifest = read_json(directory / CHECKSUMS)
    manifest["files"][path.name].update(file_record(path))
    write_json(directory / CHECKSUMS, manifest)
    with pytest.raises(CheckpointError, match="cannot be read as an embedding state"):
        embedding_checkpoint.load(HashEmbeddingBag(8, 3), None, directory)
    assert not marker.exists()


@pytest.mark.parametrize(
    "how",
    [
        "longer",
        "fifo",
        "a link to a fifo",
        "a path as a name",
        "a link outside",
        "sizes not numbers",
        "an entry without its range",
        "entries not a list",
        "no entries",
    ],
)
def test_files_that_are_not_what_the_checksums_list_are_refused(saved, tmp_path, how):
    crafted = _copy(saved, tmp_path)
    shard = sorted(crafted.glob("*.distcp"))[0]
    record = read_json(crafted / CHECKSUMS)
    if how == "a link outside":  # resealed to the outside file: a checksum cannot tell
        outside = tmp_path / "passwd"
        outside.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
        shard.unlink()
        shard.symlink_to(outside)
        record["files"][shard.name] = file_record(outside)
        write_json(crafted / CHECKSUMS, record)
        want = f"{shard.name} is not a regular file (a symbolic link"
    elif how in ("sizes not numbers", "an entry without its range", "entries not a list"):
        if how == "sizes not numbers":
            record["files"][shard.name]["bytes"] = str(record["files"][shard.name]["bytes"])
        elif how == "an entry without its range":
            del record["entries"][0]["start"]
        else:
            record["entries"] = {"0": record["entries"][0]}
        write_json(crafted / CHECKSUMS, record)
        want = f"{CHECKSUMS} is not a checksums record"
    elif how == "no entries":  # nothing vouches for any stored tensor
        del record["entries"]
        write_json(crafted / CHECKSUMS, record)
        want = "is stored in bytes no checksum covers"
    elif how == "longer":  # every chunk intact, bytes appended
        shard.write_bytes(shard.read_bytes() + b"\0" * 8)
        want = f"{shard.name} is longer"
    elif how == "fifo":  # the FIFO itself in the shard's place: refused, never waited on
        shard.unlink()
        os.mkfifo(shard)
        want = f"{shard.name} is not a regular file"
    elif how == "a link to a fifo":  # refused as a link, before anything opens the FIFO
        os.mkfifo(tmp_path / "fifo")
        shard.unlink()
        shard.symlink_to(tmp_path / "fifo")
        want = f"{shard.name} is not a regular file (a symbolic link"
    else:
        record["files"]["../elsewhere"] = {"bytes": 0}
        write_json(crafted / CHECKSUMS, record)
        want = "lists '../elsewhere', which is no file name"
    with pytest.raises(CheckpointError, match=re.escape(want)):
        checkpoint.load_full(crafted)
