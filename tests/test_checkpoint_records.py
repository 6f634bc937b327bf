"""Every record a checkpoint holds is checked against the shape its writer writes before a
load uses a field of it (`minidist.checkpoint_schema`): a forged record, resealed so that its
checksums pass, is a `CheckpointError` naming the file and the field on every load path (the
FSDP format's `.metadata` and layout record, the universal format's record, the trainer's
`--resume` in the parent, the embedding format's manifest and rank files), never a raw
KeyError, TypeError or AttributeError, and nothing changes."""

import dataclasses
import io
import json
import pickle
import re
import shutil

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_checkpoint_data import _bags, save_tiny
from test_resilience import one_process_save
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    MetadataIndex,
)

import minidist
from minidist.checkpoint_files import (
    CHECKSUMS,
    CheckpointError,
    file_record,
    read_json,
    sha256_tensor,
    write_json,
)
from minidist.embedding import checkpoint as embedding_checkpoint
from minidist.embedding.layers import HashEmbeddingBag
from minidist.embedding.optim import SparseAdagrad
from minidist.fsdp import checkpoint
from minidist.fsdp.checkpoint_layout import LAYOUT_KEY
from minidist.fsdp.checkpoint_safe import write_checksums
from minidist.resilience.universal import FORMAT, RECORD
from minidist.trainer.loop import refuse_another_run

LAYOUT = {"model_config": {"model": "gpt"}, "data": {"rows": 1}}


@pytest.fixture(scope="module")
def fsdp_saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("fsdp") / "ck"
    minidist.launch(save_tiny, 2, path)
    return path


@pytest.fixture(scope="module")
def universal_saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("universal") / "ck"
    minidist.launch(one_process_save, 1, path)
    return path


def _copy(src, tmp_path, name="copy"):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def _reseal_metadata(path):
    record = read_json(path / CHECKSUMS)
    record["files"][".metadata"] = file_record(path / ".metadata")
    write_json(path / CHECKSUMS, record)


def _change_metadata(path, change):
    meta = pickle.loads((path / ".metadata").read_bytes())  # our own file, in the test
    change(meta)
    (path / ".metadata").write_bytes(pickle.dumps(meta))
    _reseal_metadata(path)  # the chunks' checksums as saved: only the metadata is forged


def _restore(path, fqn, blob: bytes, size=None):
    """Store `blob` as entry `fqn` (appended to a data file) and reseal every checksum."""
    meta = pickle.loads((path / ".metadata").read_bytes())
    (index,) = [k for k in meta.storage_data if k.fqn == fqn]
    info = meta.storage_data[index]
    data = path / info.relative_path
    start = data.stat().st_size
    data.write_bytes(data.read_bytes() + blob)
    meta.storage_data[index] = dataclasses.replace(info, offset=start, length=len(blob))
    if size is not None:  # a tensor entry: its shape follows the new bytes
        md = meta.state_dict_metadata[fqn]
        md.size = torch.Size([size])
        md.chunks[0] = ChunkStorageMetadata(torch.Size([0]), torch.Size([size]))
    (path / ".metadata").write_bytes(pickle.dumps(meta))


def _saved_object(path, fqn):
    meta = pickle.loads((path / ".metadata").read_bytes())
    (index,) = [k for k in meta.storage_data if k.fqn == fqn]
    info = meta.storage_data[index]
    raw = (path / info.relative_path).read_bytes()[info.offset : info.offset + info.length]
    return torch.load(io.BytesIO(raw), weights_only=True)


# -- DCP's .metadata (the FSDP and universal formats read it alike) -------------------------------
def _flat(meta):
    return next(k for k in meta.state_dict_metadata if k.startswith("model.flat["))


def _tensor_field(field, value):
    def change(meta):
        md = meta.state_dict_metadata[_flat(meta)]
        if field == "dtype":
            md.properties.dtype = value
        elif field in ("size", "chunks"):
            setattr(md, field, value)
        else:
            c = md.chunks[0]
            parts = {"offsets": c.offsets, "sizes": c.sizes, field: value}
            md.chunks[0] = ChunkStorageMetadata(parts["offsets"], parts["sizes"])

    return change


def _stored_field(field, value):
    def change(meta):
        index = next(i for i in meta.storage_data if i.fqn == _flat(meta))
        setattr(meta.storage_data[index], field, value)

    return change


def _set(name, value):
    return lambda meta: setattr(meta, name, value)


def _tensor_as_object(meta):
    meta.state_dict_metadata[_flat(meta)] = BytesStorageMetadata()


def _stored_unnamed(meta):
    index = next(i for i in meta.storage_data if i.fqn == _flat(meta))
    meta.storage_data[MetadataIndex("model.nothing", index.offset)] = meta.storage_data[index]


METADATA = [
    ("dtype a string", _tensor_field("dtype", "float32"), "dtype = 'float32' is not a torch dtype"),
    ("dtype None", _tensor_field("dtype", None), "dtype = None is not a torch dtype"),
    ("size a string", _tensor_field("size", "12"), "size = '12' is not a list of ints"),
    ("size None", _tensor_field("size", None), "size = None is not a list of ints"),
    ("size floats", _tensor_field("size", [12.0]), r"size = \[12.0\] is not a list of ints"),
    ("size negative", _tensor_field("size", torch.Size([-1])), "is not a list of ints >= 0"),
    ("size 2**70", _tensor_field("size", [2**70]), "is not a list of ints"),
    ("chunks a dict", _tensor_field("chunks", {"a": 1}), "chunks = {'a': 1} is not a list"),
    ("chunks None", _tensor_field("chunks", None), "chunks = None is not a list"),
    ("chunk sizes a string", _tensor_field("sizes", "6"), r"chunks\[0\] sizes = '6'"),
    ("chunk offsets None", _tensor_field("offsets", None), r"chunks\[0\] offsets = None"),
    ("chunk offsets bool", _tensor_field("offsets", [True]), r"offsets = \[True\]"),
    ("stored offset a string", _stored_field("offset", "0"), "offset in its file = '0'"),
    ("stored offset -1", _stored_field("offset", -1), "offset in its file = -1"),
    ("stored length 2**70", _stored_field("length", 2**70), "length = 1180591620717411303424"),
    (
        "stored file None",
        _stored_field("relative_path", None),
        "file = (None|missing) is not",
    ),
    ("stored file missing", _stored_field("relative_path", "no.distcp"), "stored outside"),
    ("stored under no entry", _stored_unnamed, "model.nothing is no entry"),
    ("a tensor as an object", _tensor_as_object, "is stored nowhere"),
    ("entries a list", _set("state_dict_metadata", [1]), r"state_dict_metadata = \[1\]"),
    ("stored items a list", _set("storage_data", [1]), r"storage_data = \[1\]"),
    ("storage_meta a string", _set("storage_meta", "x"), "storage_meta = 'x'"),
]


@pytest.mark.parametrize("how, change, words", METADATA, ids=[m[0] for m in METADATA])
def test_forged_metadata_types_are_refused_naming_the_field(
    fsdp_saved, universal_saved, tmp_path, how, change, words
):
    forged = _copy(fsdp_saved, tmp_path, "fsdp")
    _change_metadata(forged, change)
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(forged))}/\.metadata: .*{words}"):
        checkpoint.load_full(forged)
    if how in ("entries a list", "stored items a list", "storage_meta a string"):
        forged = _copy(universal_saved, tmp_path, "universal")
        _change_metadata(forged, change)
        with pytest.raises(CheckpointError, match=words):
            refuse_another_run(forged, LAYOUT)


# -- the FSDP format's layout record ---------------------------------------------------------------
def _forge_layout(path, change):
    layout = json.loads(_saved_object(path, LAYOUT_KEY))
    value = change(layout)
    blob = io.BytesIO()
    torch.save(json.dumps(layout) if value is None else value, blob)
    _restore(path, LAYOUT_KEY, blob.getvalue())
    write_checksums(path, checkpoint.FORMAT)


def _unit(field, value):
    return lambda layout: layout["units"][0].__setitem__(field, value)


def _opt(field, value):
    return lambda layout: layout["optimizer"].__setitem__(field, value)


def _state_names_missing(layout):
    (key, kinds), *_ = layout["optimizer"]["state"].items()
    kinds["no_such_state"] = "sharded"


def _state_kind(kind):
    def change(layout):
        kinds = next(iter(layout["optimizer"]["state"].values()))
        kinds[next(iter(kinds))] = kind

    return change


LAYOUTS = [
    ("not a string", lambda layout: 7, "is not a JSON layout record"),
    ("a list", lambda layout: json.dumps([1]), r"the layout record = \[1\] is not an object"),
    ("an extra field", lambda layout: layout.update(extra=1), r"holds \['extra'\]"),
    ("no units", lambda layout: layout.pop("units") and None, r"has no \['units'\]"),
    ("units a dict", lambda layout: layout.update(units={}), "units = {} is not a list"),
    ("a unit's names None", _unit("names", None), r"units\[0\].names = None"),
    ("a unit's shapes strings", _unit("shapes", ["3", "3"]), r"units\[0\].shapes = '3'"),
    ("a unit's shape negative", _unit("shapes", [[-3, 5], [3]]), r"units\[0\].shapes"),
    ("a unit's key another", _unit("key", "flat[x]"), r"units\[0\].key = 'flat\[x\]'"),
    ("a unit's dtype another", _unit("dtype", "torch.int8"), "its layout record says"),
    ("a unit longer", _unit("shapes", [[3, 50], [3]]), "its layout record says"),
    ("aliases a list", lambda layout: layout.update(aliases=[]), r"aliases = \[\]"),
    ("an alias of nothing", lambda layout: layout.update(aliases={"a": "b"}), "aliases"),
    ("optimizer a list", lambda layout: layout.update(optimizer=[]), r"optimizer = \[\]"),
    ("groups of unknown units", _opt("groups", [["flat[x]"]]), "optimizer.groups"),
    ("state a list", _opt("state", []), r"optimizer.state = \[\]"),
    ("a state kind unknown", _opt("state", {}), None),
    ("a state stored nowhere", _state_names_missing, r"optim\.flat\[.*no_such_state is missing"),
]
LAYOUTS[-2] = ("a state kind unknown", _state_kind("pickled"), "= 'pickled' is not one of")


@pytest.mark.parametrize("how, change, words", LAYOUTS, ids=[c[0] for c in LAYOUTS])
def test_a_forged_fsdp_layout_record_is_refused_naming_the_field(
    fsdp_saved, tmp_path, how, change, words
):
    forged = _copy(fsdp_saved, tmp_path)
    _forge_layout(forged, change)
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(forged))}.*{words}"):
        checkpoint.load_full(forged)


# -- the universal format's record (what train --resume reads first, in the parent) ---------------
def _forge_record(path, change):
    data = _saved_object(path, RECORD)
    record = json.loads(bytes(data.tolist()).decode())
    change(record)
    body = json.dumps(record).encode()
    blob = io.BytesIO()
    torch.save(torch.frombuffer(bytearray(body), dtype=torch.uint8), blob)
    _restore(path, RECORD, blob.getvalue(), size=len(body))
    write_checksums(path, FORMAT)


def _field(name, value):
    return lambda record: record.__setitem__(name, value)


RECORDS = [
    ("rng_streams a stream not stored", _field("rng_streams", ["nope"]), "rng.0.nope is missing"),
    ("rng_streams a string", _field("rng_streams", "torch.cpu"), "rng_streams = 'torch.cpu'"),
    ("rng_streams None", _field("rng_streams", None), "rng_streams = None"),
    ("rng_streams twice", _field("rng_streams", ["torch.cpu"] * 2), "distinct names"),
    ("layout a list", _field("layout", [1, 2]), r"layout = \[1, 2\] is not an object"),
    ("layout a string", _field("layout", "model_config"), "layout = 'model_config' is not"),
    ("layout None", _field("layout", None), "layout = None is not an object"),
    ("step a string", _field("step", "3"), "step = '3' is not an int"),
    ("step -1", _field("step", -1), "step = -1 is not an int"),
    ("step a float", _field("step", 1.5), "step = 1.5 is not an int"),
    ("step a bool", _field("step", True), "step = True is not an int"),
    ("step 2**70", _field("step", 2**70), "step = 1180591620717411303424 is not an int"),
    ("samples NaN", _field("samples", float("nan")), "samples = nan is not an int"),
    ("world a string", _field("world", "1"), "world = '1' is not an int"),
    ("world 0", _field("world", 0), r"world = 0 is not an int in \[1,"),
    ("scaler a list", _field("scaler", [1]), r"scaler = \[1\] is not an object"),
    (
        "scaler scale NaN",
        _field("scaler", dict(scale_value=float("nan"), good_steps=0, skipped_in_a_row=0)),
        "scale_value = nan",
    ),
    ("format another", _field("format", "x"), "format = 'x' is not"),
    ("an extra field", _field("payload", {"x": 1}), r"the record holds \['payload'\]"),
]


@pytest.mark.parametrize("how, change, words", RECORDS, ids=[c[0] for c in RECORDS])
def test_a_forged_universal_record_is_refused_in_the_parent_naming_the_field(
    universal_saved, tmp_path, how, change, words
):
    forged = _copy(universal_saved, tmp_path)
    _forge_record(forged, change)
    with pytest.raises(CheckpointError, match=rf"__0_0\.distcp: minidist\.record: .*{words}"):
        refuse_another_run(forged, LAYOUT)


def same_layout_load(path):
    """One process loading on the layout that saved: the error, and whether nothing changed."""
    from minidist.data_parallel.fixture import build
    from minidist.resilience import CheckpointLayoutError, load
    from minidist.resilience.lesson_pieces import materialize_optimizer_state, module_pieces
    from minidist.zero.fixture import ADAM

    model, _, _ = build("gpt")
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], **ADAM)
    materialize_optimizer_state(opt)
    pieces = module_pieces(model, opt)
    before = [p.tensor.clone() for p in pieces]
    try:
        load(path, pieces, {"one process": 1})
        error = None
    except (CheckpointLayoutError, CheckpointError) as e:
        error = e
    return error, all(torch.equal(b, p.tensor) for b, p in zip(before, pieces))


@pytest.mark.parametrize("how", ["rng_streams a stream not stored", "step a string"])
def test_a_forged_universal_record_is_refused_by_the_ranks_untouched(
    universal_saved, tmp_path, how
):
    """The same layout reads the streams (was a KeyError); a step that is no int was found
    only after the pieces were filled (a ValueError, the model changed)."""
    forged = _copy(universal_saved, tmp_path)
    _, change, words = next(c for c in RECORDS if c[0] == how)
    _forge_record(forged, change)
    ((error, untouched),) = minidist.launch(same_layout_load, 1, forged)
    assert isinstance(error, CheckpointError) and re.search(words, str(error)), error
    assert untouched


def test_train_resume_of_a_forged_record_is_one_line_before_any_rank(
    universal_saved, tmp_path, capsys
):
    from minidist.__main__ import main

    forged = _copy(universal_saved, tmp_path)
    _forge_record(forged, _field("layout", "model_config"))
    with pytest.raises(SystemExit) as stop:
        main(["train", "--resume", str(forged)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "minidist.record: layout = 'model_config' is not an object" in err.splitlines()[-1]


WRONG = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=True),
    st.integers(min_value=-(2**80), max_value=-1),
    st.integers(min_value=2**63, max_value=2**80),
    st.text(max_size=3),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    field=st.sampled_from(["layout", "world", "step", "samples", "scaler", "rng_streams"]),
    value=WRONG,
)
def test_any_wrong_typed_record_field_is_a_checkpoint_error(
    universal_saved, tmp_path, field, value
):
    """Sampled: whatever a field holds, a load refuses it or reads it (never a raw error)."""
    forged = tmp_path / "sampled"
    shutil.rmtree(forged, ignore_errors=True)
    shutil.copytree(universal_saved, forged)
    _forge_record(forged, _field(field, value))
    try:
        refuse_another_run(forged, LAYOUT)
    except CheckpointError as e:
        assert f"{field}" in str(e)
    else:  # only what the writer writes: any JSON object, no streams, no scaler
        assert (field, value) in (("rng_streams", []), ("scaler", None)) or (
            field == "layout" and isinstance(value, dict)
        ), (field, value)


# -- the embedding format's manifest and rank files ------------------------------------------------
@pytest.fixture(scope="module")
def embedding_saved(tmp_path_factory):
    layer = HashEmbeddingBag(64, 3)
    optimizer = SparseAdagrad([layer.weight])
    layer(*_bags()).sum().backward()
    optimizer.step()
    path = tmp_path_factory.mktemp("emb") / "emb"
    embedding_checkpoint.save(layer, optimizer, path)
    return path


def _manifest(change):
    def forge(path):
        manifest = read_json(path / CHECKSUMS)
        change(manifest)
        write_json(path / CHECKSUMS, manifest)

    return forge


def _rank_file(change):
    def forge(path):
        rank = embedding_checkpoint.rank_path(path, 0)
        state = torch.load(rank, weights_only=True)
        change(state)
        torch.save(state, rank)
        manifest = read_json(path / CHECKSUMS)
        tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
        if isinstance(state.get("optimizer"), dict):
            tensors.update({f"optimizer.{k}": v for k, v in state["optimizer"].items()})
        manifest["files"][rank.name].update(file_record(rank))
        manifest["files"][rank.name]["tensors"] = {n: sha256_tensor(t) for n, t in tensors.items()}
        write_json(path / CHECKSUMS, manifest)

    return forge


def _file(field, value):
    return lambda m: m["files"]["embedding_rank0.pt"].__setitem__(field, value)


EMBEDDINGS = [
    ("world a string", _manifest(lambda m: m.update(world="1")), "world = '1' is not an int"),
    ("world 2**70", _manifest(lambda m: m.update(world=2**70)), "world = 1180591620717411303424"),
    ("world 2 with one file", _manifest(lambda m: m.update(world=2)), "world = 2 is not 1"),
    ("kind unknown", _manifest(lambda m: m.update(kind="x")), "kind = 'x' is not one of"),
    ("dim a float", _manifest(lambda m: m.update(dim=3.0)), "dim = 3.0 is not an int"),
    ("files a list", _manifest(lambda m: m.update(files=[])), "is not a checksums record"),
    ("an extra field", _manifest(lambda m: m.update(extra=1)), r"holds \['extra'\]"),
    ("tensors a list", _manifest(_file("tensors", [])), r"tensors = \[\] is not"),
    ("no sha256", _manifest(lambda m: m["files"]["embedding_rank0.pt"].pop("sha256")), "sha256"),
    ("keys floats", _rank_file(lambda s: s.update(keys=s["keys"].double())), "keys = tensor"),
    ("vectors 1-D", _rank_file(lambda s: s.update(vectors=s["vectors"][:, 0])), "vectors ="),
    ("optimizer a list", _rank_file(lambda s: s.update(optimizer=[])), r"optimizer = \[\]"),
    ("dim another", _rank_file(lambda s: s.update(dim=5)), "dim=5, mode='sum' are not"),
    ("no keys", _rank_file(lambda s: s.pop("keys")), r"the state has no \['keys'\]"),
]


@pytest.mark.parametrize("how, forge, words", EMBEDDINGS, ids=[c[0] for c in EMBEDDINGS])
def test_a_forged_embedding_record_is_refused_untouched(
    embedding_saved, tmp_path, how, forge, words
):
    forged = _copy(embedding_saved, tmp_path)
    forge(forged)
    fresh = HashEmbeddingBag(64, 3)
    with pytest.raises(CheckpointError, match=words):
        embedding_checkpoint.load(fresh, SparseAdagrad([fresh.weight]), forged)
    assert fresh.table.size == 0
